! The SCR drop-in's Fortran interface (docs/design/compat.md): the constants
! of SCR's scrf.h, for `INCLUDE 'scrf.h'` in fixed or free form. The calls
! (SCR_INIT(ierr), SCR_ROUTE_FILE(name, file, ierr), ...) are in libscrf,
! over libscr; link with -lscrf -lscr.
      INTEGER SCR_SUCCESS
      PARAMETER (SCR_SUCCESS=0)
      INTEGER SCR_MAX_FILENAME
      PARAMETER (SCR_MAX_FILENAME=1024)
      INTEGER SCR_FLAG_NONE
      PARAMETER (SCR_FLAG_NONE=0)
      INTEGER SCR_FLAG_CHECKPOINT
      PARAMETER (SCR_FLAG_CHECKPOINT=1)
      INTEGER SCR_FLAG_OUTPUT
      PARAMETER (SCR_FLAG_OUTPUT=2)
