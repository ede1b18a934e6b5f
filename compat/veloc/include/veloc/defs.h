/* The constants of VELOC's veloc/defs.h (veloc.h and veloc.hpp include it). */
#ifndef VELOC_DEFS_H
#define VELOC_DEFS_H

#define VELOC_SUCCESS (0)
#define VELOC_FAILURE (-1)

/* Size of the buffers VELOC_Route_file writes into. */
#define VELOC_MAX_NAME (1024)

/* Modes of VELOC_Recover_selective and VELOC_Checkpoint_selective. */
#define VELOC_RECOVER_ALL (0)
#define VELOC_RECOVER_SOME (1)
#define VELOC_RECOVER_REST (2)
#define VELOC_CKPT_ALL (0)
#define VELOC_CKPT_SOME (1)
#define VELOC_CKPT_REST (2)

/* register_observer (veloc.hpp): called after each checkpoint_end with its name and version. */
#define VELOC_OBSERVE_CKPT_END (0)

#endif
