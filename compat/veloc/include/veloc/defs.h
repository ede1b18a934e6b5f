/* The constants of VELOC's veloc/defs.h, for code that includes it on its
 * own (veloc.h and veloc.hpp define the same values). */
#ifndef VELOC_DEFS_H
#define VELOC_DEFS_H

#ifndef VELOC_SUCCESS
#define VELOC_SUCCESS (0)
#define VELOC_FAILURE (-1)
#define VELOC_MAX_NAME (1024)
#define VELOC_RECOVER_ALL (0)
#define VELOC_RECOVER_SOME (1)
#define VELOC_RECOVER_REST (2)
#define VELOC_CKPT_ALL (0)
#define VELOC_CKPT_SOME (1)
#define VELOC_CKPT_REST (2)
#endif

/* register_observer: called after each checkpoint_end with its name and version. */
#define VELOC_OBSERVE_CKPT_END (0)

#endif
