/* cairn: read-only access to a store (the persistent level) from C.
 *
 * The reader that Python's cairn.open (bindings/python) calls, so that one
 * implementation, the C++ one every cairn tool uses, reads the formats of
 * docs/format/ (store.md, manifest.md, container.md, shard.md, run.md).
 * Return codes and cairn_last_error() are those of cairn.h.
 *
 * Metadata come back as JSON text the caller frees with cairn_store_free:
 * the format's own JSON for MANIFEST and RUN files, and for shard headers
 * the object documented at cairn_store_shard_header. A store handle holds no
 * open file; it may be used by one thread at a time.
 */
#ifndef CAIRN_STORE_H
#define CAIRN_STORE_H

#include <stdint.h>

#include "cairn.h"

#ifdef __cplusplus
extern "C" {
#endif
#if defined(__GNUC__) /* exported from libcairn, which hides everything else */
#pragma GCC visibility push(default)
#endif

typedef struct cairn_store cairn_store_t;

/* Opens the store at `path` (a directory holding runs/). ENOTFOUND when it is
 * missing or not a store. Close with cairn_store_close. */
int cairn_store_open(const char *path, cairn_store_t **out);
void cairn_store_close(cairn_store_t *s);
/* Frees text returned by the functions below (NULL is fine). */
void cairn_store_free(char *text);

/* JSON arrays, sorted: runs with a committed version; checkpoint names of a
 * run with a committed version; committed versions (a valid MANIFEST) of a
 * checkpoint, ascending. Versions being written, debris of a crash and damaged
 * MANIFESTs are left out. */
int cairn_store_runs(cairn_store_t *s, char **json);
int cairn_store_checkpoints(cairn_store_t *s, const char *run, char **json);
int cairn_store_versions(cairn_store_t *s, const char *run, const char *name, char **json);

/* The version's MANIFEST, verified (checksum, format, that it is this
 * version's, an aggregated version's extents), as its JSON body. ENOTFOUND:
 * not committed; ECORRUPT: damaged; ENOTSUP: a newer format. */
int cairn_store_manifest(cairn_store_t *s, const char *run, const char *name, int64_t version, char **json);

/* The run's RUN file (docs/format/run.md), verified, as its JSON body;
 * ENOTFOUND when the run has none. */
int cairn_store_run_info(cairn_store_t *s, const char *run, char **json);

/* The header of rank `rank`'s shard of a committed version (a shard file,
 * or its image in an aggregated version's data files), validated and checked
 * against the MANIFEST (size, header checksum, run/name/version/rank). JSON:
 *   {"path", "format_version", "run", "name", "version", "rank", "nranks",
 *    "data_offset", "file_size", "header_checksum", "stored_size",
 *    "regions": [{"name", "type", "type_name", "flags", "compression",
 *                 "dims", "global", "start", "count", "offset", "length",
 *                 "checksum", "stored_offset", "stored_length"}]}
 * with offsets and sizes of the uncompressed image (shard.md). ENOTFOUND: no
 * such version or rank; ECORRUPT: a missing, truncated or damaged file. */
int cairn_store_shard_header(cairn_store_t *s, const char *run, const char *name, int64_t version, uint32_t rank,
                             char **json);

/* Reads region `region` of rank `rank`'s shard whole into buf (exactly its
 * length in bytes: `bytes` must equal it), decompressing a compressed region,
 * after the checks of cairn_store_shard_header; its checksum is verified.
 * ENOTFOUND: no such region; EINVAL: bytes is not the region's length. */
int cairn_store_read_region(cairn_store_t *s, const char *run, const char *name, int64_t version, uint32_t rank,
                            const char *region, void *buf, uint64_t bytes);

/* The keys of the tensors of a state saved by cairn.pytorch
 * (docs/format/torch_state.md) in rank `rank`'s shard, read from its
 * `__cairn_state__` region (checksum verified): {"t000004":
 * "model.fc1.weight", ...}, one entry per tensor region; {} when the shard
 * holds no such state. ENOTSUP: a state of a newer format; ECORRUPT: a state
 * that does not decode. */
int cairn_store_region_keys(cairn_store_t *s, const char *run, const char *name, int64_t version, uint32_t rank,
                            char **json);

/* The header of one shard file at `path`, any format (1 to 3), validated as
 * above but checked against no MANIFEST. */
int cairn_shard_file_header(const char *path, char **json);

#if defined(__GNUC__)
#pragma GCC visibility pop
#endif
#ifdef __cplusplus
}
#endif

#endif
