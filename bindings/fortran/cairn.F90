! cairn: the Fortran interface (`use cairn`) over the C API (include/cairn.h).
!
! Conventions (as in C, see include/cairn.h for each call's contract)
!  - Every call is a subroutine with an optional last argument `ierr`. With it,
!    ierr receives CAIRN_OK (0) or a negative CAIRN_E* code and the program goes
!    on; cairn_strerror(ierr) and cairn_last_error() say what went wrong. Without
!    it, a failure prints the message to standard error and stops the program
!    (`error stop`), as MPI does with its default error handler. Pass ierr where
!    a failure is an expected outcome: cairn_restart_test gives CAIRN_ENOTFOUND
!    when there is nothing to restart from.
!  - Arrays are protected in place: cairn keeps their address and reads them at
!    each cairn_checkpoint, writes them at cairn_restart. They must therefore be
!    contiguous (a non-contiguous section such as a(1:n:2) or a(2,:) is refused
!    with CAIRN_EINVAL and a message naming the region), must have the TARGET,
!    POINTER or ALLOCATABLE attribute in the caller (so that the compiler passes
!    the array itself, not a copy), and must stay allocated and in place until
!    cairn_unprotect or cairn_finalize. An array that is reallocated, or a
!    pointer that is switched to another array (double buffering: `u => grid2`),
!    must be protected again, under the same name, before the next checkpoint.
!  - Shapes are recorded in Fortran order with the column-major flag, so that
!    `cairn show` and the Python reader see a(nx, ny) as it is in Fortran.
!  - Versions are integer(int64) (e.g. `10_int64` or `int(it, int64)`).
!  - A handle is used by one thread at a time. Under MPI (cairn_init_mpi) the
!    collective calls are made by every rank in the same order.
module cairn
  use, intrinsic :: iso_c_binding
  use, intrinsic :: iso_fortran_env, only: real32, real64, int32, int64, error_unit
#ifdef CAIRN_HAVE_MPI
  use mpi_f08, only: MPI_Comm
#endif
  implicit none
  private

  ! A cairn handle: create with cairn_init or cairn_init_mpi, release with
  ! cairn_finalize.
  type, public :: cairn_t
    private
    type(c_ptr) :: ptr = c_null_ptr
  end type cairn_t

  ! Return codes (include/cairn.h).
  integer, parameter, public :: CAIRN_OK = 0
  integer, parameter, public :: CAIRN_EINVAL = -1
  integer, parameter, public :: CAIRN_ENOTFOUND = -2
  integer, parameter, public :: CAIRN_ECORRUPT = -3
  integer, parameter, public :: CAIRN_EIO = -4
  integer, parameter, public :: CAIRN_ENOSPC = -5
  integer, parameter, public :: CAIRN_EAGAIN = -6
  integer, parameter, public :: CAIRN_ECANCELLED = -7
  integer, parameter, public :: CAIRN_ENOTSUP = -8
  integer, parameter, public :: CAIRN_EINTERNAL = -9
  integer, parameter, public :: CAIRN_EDIVERGED = -10
  integer, parameter, public :: CAIRN_EUNUSABLE = -11
  integer, parameter, public :: CAIRN_EEXIST = -12
  ! cairn_checkpoint took its version; an earlier version failed (a warning).
  integer, parameter, public :: CAIRN_EEARLIER = -13
  integer, parameter, public :: CAIRN_EBUSY = -14

  ! Storage levels, as bits of the mask cairn_test returns.
  integer, parameter, public :: CAIRN_LEVEL_CAPTURED = 1
  integer, parameter, public :: CAIRN_LEVEL_LOCAL = 2
  integer, parameter, public :: CAIRN_LEVEL_PROTECTED = 4
  integer, parameter, public :: CAIRN_LEVEL_PERSISTENT = 8

  integer, parameter, public :: CAIRN_MAX_DIMS = 8

  ! Element types (cairn_type_t); the values are stored on disk.
  integer(c_int), parameter :: T_INT32 = 3, T_INT64 = 4, T_FLOAT32 = 9, T_FLOAT64 = 10

  public :: cairn_init, cairn_finalize, cairn_rank, cairn_size
#ifdef CAIRN_HAVE_MPI
  public :: cairn_init_mpi
#endif
  public :: cairn_protect, cairn_protect_block, cairn_unprotect
  public :: cairn_checkpoint, cairn_test, cairn_wait, cairn_restart_test, cairn_restart
  public :: cairn_checkpoint_begin, cairn_route_file, cairn_checkpoint_end
  public :: cairn_restart_begin, cairn_restart_end
  public :: cairn_set_code_version, cairn_tag
  public :: cairn_strerror, cairn_last_error

#ifdef CAIRN_HAVE_MPI
  ! cairn_init_mpi(h, comm [, config] [, ierr]): comm is an mpi_f08
  ! type(MPI_Comm) or an integer handle of `use mpi` / mpif.h.
  interface cairn_init_mpi
    module procedure init_mpi_f08, init_mpi_int
  end interface cairn_init_mpi
#endif

  ! cairn_protect(h, name, array [, ierr]): an array of any rank (or a scalar)
  ! of real(real32), real(real64), integer(int32) or integer(int64).
  interface cairn_protect
    module procedure protect_r4, protect_r8, protect_i4, protect_i8
  end interface cairn_protect

  ! cairn_protect_block(h, name, array, global_shape, start, count [, mem_start] [, ierr]):
  ! this rank holds the block of `count` elements at `start` (0-based offsets)
  ! of a global array of shape `global_shape`. `array` is the rank's whole
  ! buffer; the block begins at the 0-based offsets `mem_start` in it (e.g.
  ! (1, 1) past a halo); without mem_start, array is exactly the block. Only
  ! the block is stored and restored. All in Fortran order, size rank(array).
  interface cairn_protect_block
    module procedure protect_block_r4, protect_block_r8, protect_block_i4, protect_block_i8
  end interface cairn_protect_block

  ! The C API.
  interface
    function c_init(config, out) bind(C, name="cairn_init") result(rc)
      import :: c_int, c_ptr
      type(c_ptr), value :: config
      type(c_ptr), intent(out) :: out
      integer(c_int) :: rc
    end function c_init
#ifdef CAIRN_HAVE_MPI
    function c_init_mpi(comm, config, out) bind(C, name="cairn_fortran_init_mpi") result(rc)
      import :: c_int, c_ptr
      integer(c_int), value :: comm
      type(c_ptr), value :: config
      type(c_ptr), intent(out) :: out
      integer(c_int) :: rc
    end function c_init_mpi
#endif
    function c_protect(c, region, ptr, count, type) bind(C, name="cairn_protect") result(rc)
      import :: c_int, c_ptr, c_char, c_size_t
      type(c_ptr), value :: c
      character(kind=c_char), dimension(*) :: region
      type(c_ptr), value :: ptr
      integer(c_size_t), value :: count
      integer(c_int), value :: type
      integer(c_int) :: rc
    end function c_protect
    function c_protect_shaped(c, region, ptr, type, ndims, dims, column_major) &
        bind(C, name="cairn_protect_shaped") result(rc)
      import :: c_int, c_ptr, c_char, c_int64_t
      type(c_ptr), value :: c
      character(kind=c_char), dimension(*) :: region
      type(c_ptr), value :: ptr
      integer(c_int), value :: type, ndims
      integer(c_int64_t), dimension(*), intent(in) :: dims
      integer(c_int), value :: column_major
      integer(c_int) :: rc
    end function c_protect_shaped
    function c_protect_block(c, region, ptr, type, ndims, global_shape, start, count, mem_shape, &
        mem_start, column_major) bind(C, name="cairn_protect_block") result(rc)
      import :: c_int, c_ptr, c_char, c_int64_t
      type(c_ptr), value :: c
      character(kind=c_char), dimension(*) :: region
      type(c_ptr), value :: ptr
      integer(c_int), value :: type, ndims
      integer(c_int64_t), dimension(*), intent(in) :: global_shape, start, count
      type(c_ptr), value :: mem_shape, mem_start
      integer(c_int), value :: column_major
      integer(c_int) :: rc
    end function c_protect_block
    function c_unprotect(c, region) bind(C, name="cairn_unprotect") result(rc)
      import :: c_int, c_ptr, c_char
      type(c_ptr), value :: c
      character(kind=c_char), dimension(*) :: region
      integer(c_int) :: rc
    end function c_unprotect
    function c_checkpoint(c, name, version) bind(C, name="cairn_checkpoint") result(rc)
      import :: c_int, c_ptr, c_char, c_int64_t
      type(c_ptr), value :: c
      character(kind=c_char), dimension(*) :: name
      integer(c_int64_t), value :: version
      integer(c_int) :: rc
    end function c_checkpoint
    function c_test(c, name, version, levels) bind(C, name="cairn_test") result(rc)
      import :: c_int, c_ptr, c_char, c_int64_t
      type(c_ptr), value :: c
      character(kind=c_char), dimension(*) :: name
      integer(c_int64_t), value :: version
      integer(c_int), intent(out) :: levels  ! unsigned in C; the bits fit
      integer(c_int) :: rc
    end function c_test
    function c_wait(c, name, version, level) bind(C, name="cairn_wait") result(rc)
      import :: c_int, c_ptr, c_char, c_int64_t
      type(c_ptr), value :: c
      character(kind=c_char), dimension(*) :: name
      integer(c_int64_t), value :: version
      integer(c_int), value :: level
      integer(c_int) :: rc
    end function c_wait
    function c_restart_test(c, name, version) bind(C, name="cairn_restart_test") result(rc)
      import :: c_int, c_ptr, c_char, c_int64_t
      type(c_ptr), value :: c
      character(kind=c_char), dimension(*) :: name
      integer(c_int64_t), intent(out) :: version
      integer(c_int) :: rc
    end function c_restart_test
    function c_restart(c, name, version) bind(C, name="cairn_restart") result(rc)
      import :: c_int, c_ptr, c_char, c_int64_t
      type(c_ptr), value :: c
      character(kind=c_char), dimension(*) :: name
      integer(c_int64_t), value :: version
      integer(c_int) :: rc
    end function c_restart
    function c_finalize(c, wait_for_pending) bind(C, name="cairn_finalize") result(rc)
      import :: c_int, c_ptr
      type(c_ptr), intent(inout) :: c
      integer(c_int), value :: wait_for_pending
      integer(c_int) :: rc
    end function c_finalize
    function c_strerror(code) bind(C, name="cairn_strerror") result(p)
      import :: c_int, c_ptr
      integer(c_int), value :: code
      type(c_ptr) :: p
    end function c_strerror
    function c_last_error() bind(C, name="cairn_last_error") result(p)
      import :: c_ptr
      type(c_ptr) :: p
    end function c_last_error
    function c_rank(c) bind(C, name="cairn_rank") result(r)
      import :: c_int, c_ptr
      type(c_ptr), value :: c
      integer(c_int) :: r
    end function c_rank
    function c_size(c) bind(C, name="cairn_size") result(r)
      import :: c_int, c_ptr
      type(c_ptr), value :: c
      integer(c_int) :: r
    end function c_size
    function c_set_code_version(c, v) bind(C, name="cairn_set_code_version") result(rc)
      import :: c_int, c_ptr, c_char
      type(c_ptr), value :: c
      character(kind=c_char), dimension(*) :: v
      integer(c_int) :: rc
    end function c_set_code_version
    function c_tag(c, key, value) bind(C, name="cairn_tag") result(rc)
      import :: c_int, c_ptr, c_char
      type(c_ptr), value :: c
      character(kind=c_char), dimension(*) :: key, value
      integer(c_int) :: rc
    end function c_tag
    function c_checkpoint_begin(c, name, version) bind(C, name="cairn_checkpoint_begin") result(rc)
      import :: c_int, c_ptr, c_char, c_int64_t
      type(c_ptr), value :: c
      character(kind=c_char), dimension(*) :: name
      integer(c_int64_t), value :: version
      integer(c_int) :: rc
    end function c_checkpoint_begin
    function c_route_file(c, file, routed, routed_len) bind(C, name="cairn_route_file") result(rc)
      import :: c_int, c_ptr, c_char, c_size_t
      type(c_ptr), value :: c
      character(kind=c_char), dimension(*) :: file
      character(kind=c_char), dimension(*) :: routed
      integer(c_size_t), value :: routed_len
      integer(c_int) :: rc
    end function c_route_file
    function c_checkpoint_end(c, success) bind(C, name="cairn_checkpoint_end") result(rc)
      import :: c_int, c_ptr
      type(c_ptr), value :: c
      integer(c_int), value :: success
      integer(c_int) :: rc
    end function c_checkpoint_end
    function c_restart_begin(c, name, version) bind(C, name="cairn_restart_begin") result(rc)
      import :: c_int, c_ptr, c_char, c_int64_t
      type(c_ptr), value :: c
      character(kind=c_char), dimension(*) :: name
      integer(c_int64_t), value :: version
      integer(c_int) :: rc
    end function c_restart_begin
    function c_restart_end(c, success) bind(C, name="cairn_restart_end") result(rc)
      import :: c_int, c_ptr
      type(c_ptr), value :: c
      integer(c_int), value :: success
      integer(c_int) :: rc
    end function c_restart_end
    function c_strlen(s) bind(C, name="strlen") result(n)
      import :: c_ptr, c_size_t
      type(c_ptr), value :: s
      integer(c_size_t) :: n
    end function c_strlen
  end interface

  ! An error found by this module before calling C (a non-contiguous array, a
  ! rank beyond CAIRN_MAX_DIMS, a result that does not fit): its message is
  ! what cairn_last_error returns until the next call into C.
  character(len=:), allocatable, save :: fortran_error
  logical, save :: fortran_error_set = .false.

contains

  ! ---- errors and strings ------------------------------------------------------

  ! The message for a return code.
  function cairn_strerror(code) result(s)
    integer, intent(in) :: code
    character(len=:), allocatable :: s
    s = from_c(c_strerror(int(code, c_int)))
  end function cairn_strerror

  ! What the last failed call (of this process) said: what failed, where, and
  ! what to do.
  function cairn_last_error() result(s)
    character(len=:), allocatable :: s
    if (fortran_error_set) then
      s = fortran_error
    else
      s = from_c(c_last_error())
    end if
  end function cairn_last_error

  function from_c(p) result(s)
    type(c_ptr), intent(in) :: p
    character(len=:), allocatable :: s
    character(kind=c_char), pointer :: chars(:)
    integer(c_size_t) :: n, i
    if (.not. c_associated(p)) then
      s = ''
      return
    end if
    n = c_strlen(p)
    call c_f_pointer(p, chars, [n])
    allocate (character(len=n) :: s)
    do i = 1, n
      s(i:i) = chars(i)
    end do
  end function from_c

  ! A Fortran string as a C string: trailing blanks dropped, NUL appended.
  pure function c_str(s) result(r)
    character(len=*), intent(in) :: s
    character(len=len_trim(s) + 1, kind=c_char) :: r
    r = trim(s)//c_null_char
  end function c_str

  ! Reports the result of a call into C.
  subroutine done(rc, what, ierr)
    integer(c_int), intent(in) :: rc
    character(len=*), intent(in) :: what
    integer, intent(out), optional :: ierr
    fortran_error_set = .false.
    call report(int(rc), what, ierr)
  end subroutine done

  ! Reports an error found in this module.
  subroutine fail(code, message, what, ierr)
    integer, intent(in) :: code
    character(len=*), intent(in) :: message, what
    integer, intent(out), optional :: ierr
    fortran_error = message
    fortran_error_set = .true.
    call report(code, what, ierr)
  end subroutine fail

  subroutine report(code, what, ierr)
    integer, intent(in) :: code
    character(len=*), intent(in) :: what
    integer, intent(out), optional :: ierr
    if (present(ierr)) then
      ierr = code
    else if (code == CAIRN_EEARLIER) then
      ! The call did its work: an earlier version's failure is a warning.
      write (error_unit, '(a)') 'cairn: warning: '//what//': '//cairn_last_error()
      flush (error_unit)
    else if (code /= CAIRN_OK) then
      write (error_unit, '(a)') 'cairn: '//what//' failed: '//cairn_strerror(code)//': '// &
        cairn_last_error()//' (pass ierr to handle errors in the program)'
      flush (error_unit)
      error stop 1
    end if
  end subroutine report

  ! ---- handles -------------------------------------------------------------------

  ! Creates a single-process handle. config names a TOML file (or is absent);
  ! CAIRN_<KEY> environment variables win over it.
  subroutine cairn_init(h, config, ierr)
    type(cairn_t), intent(out) :: h
    character(len=*), intent(in), optional :: config
    integer, intent(out), optional :: ierr
    character(len=:, kind=c_char), allocatable, target :: cfg
    type(c_ptr) :: cfg_ptr
    cfg_ptr = c_null_ptr
    if (present(config)) then
      cfg = c_str(config)
      cfg_ptr = c_loc(cfg)
    end if
    call done(c_init(cfg_ptr, h%ptr), 'cairn_init', ierr)
  end subroutine cairn_init

#ifdef CAIRN_HAVE_MPI
  ! Collective over comm (duplicated by cairn).
  subroutine init_mpi_f08(h, comm, config, ierr)
    type(cairn_t), intent(out) :: h
    type(MPI_Comm), intent(in) :: comm
    character(len=*), intent(in), optional :: config
    integer, intent(out), optional :: ierr
    call init_mpi_int(h, comm%MPI_VAL, config, ierr)
  end subroutine init_mpi_f08

  subroutine init_mpi_int(h, comm, config, ierr)
    type(cairn_t), intent(out) :: h
    integer, intent(in) :: comm
    character(len=*), intent(in), optional :: config
    integer, intent(out), optional :: ierr
    character(len=:, kind=c_char), allocatable, target :: cfg
    type(c_ptr) :: cfg_ptr
    cfg_ptr = c_null_ptr
    if (present(config)) then
      cfg = c_str(config)
      cfg_ptr = c_loc(cfg)
    end if
    call done(c_init_mpi(int(comm, c_int), cfg_ptr, h%ptr), 'cairn_init_mpi', ierr)
  end subroutine init_mpi_int
#endif

  ! Collective. wait_for_pending (default .true.): wait until every pending
  ! version has reached every level scheduled for it; .false. cancels pending
  ! background work. The handle is released, also on error.
  subroutine cairn_finalize(h, wait_for_pending, ierr)
    type(cairn_t), intent(inout) :: h
    logical, intent(in), optional :: wait_for_pending
    integer, intent(out), optional :: ierr
    integer(c_int) :: w
    w = 1
    if (present(wait_for_pending)) then
      if (.not. wait_for_pending) w = 0
    end if
    call done(c_finalize(h%ptr, w), 'cairn_finalize', ierr)
  end subroutine cairn_finalize

  ! Rank and size of the handle's communicator (0 and 1 for cairn_init).
  integer function cairn_rank(h)
    type(cairn_t), intent(in) :: h
    cairn_rank = int(c_rank(h%ptr))
  end function cairn_rank

  integer function cairn_size(h)
    type(cairn_t), intent(in) :: h
    cairn_size = int(c_size(h%ptr))
  end function cairn_size

  ! ---- regions -------------------------------------------------------------------

  subroutine protect_r4(h, name, a, ierr)
    type(cairn_t), intent(in) :: h
    character(len=*), intent(in) :: name
    real(real32), dimension(..), target :: a
    integer, intent(out), optional :: ierr
    call protect_any(h, name, c_loc(a), T_FLOAT32, rank(a), shape(a, kind=int64), is_contiguous(a), ierr)
  end subroutine protect_r4

  subroutine protect_r8(h, name, a, ierr)
    type(cairn_t), intent(in) :: h
    character(len=*), intent(in) :: name
    real(real64), dimension(..), target :: a
    integer, intent(out), optional :: ierr
    call protect_any(h, name, c_loc(a), T_FLOAT64, rank(a), shape(a, kind=int64), is_contiguous(a), ierr)
  end subroutine protect_r8

  subroutine protect_i4(h, name, a, ierr)
    type(cairn_t), intent(in) :: h
    character(len=*), intent(in) :: name
    integer(int32), dimension(..), target :: a
    integer, intent(out), optional :: ierr
    call protect_any(h, name, c_loc(a), T_INT32, rank(a), shape(a, kind=int64), is_contiguous(a), ierr)
  end subroutine protect_i4

  subroutine protect_i8(h, name, a, ierr)
    type(cairn_t), intent(in) :: h
    character(len=*), intent(in) :: name
    integer(int64), dimension(..), target :: a
    integer, intent(out), optional :: ierr
    call protect_any(h, name, c_loc(a), T_INT64, rank(a), shape(a, kind=int64), is_contiguous(a), ierr)
  end subroutine protect_i8

  subroutine protect_any(h, name, addr, type, ndims, dims, contiguous, ierr)
    type(cairn_t), intent(in) :: h
    character(len=*), intent(in) :: name
    type(c_ptr), intent(in) :: addr
    integer(c_int), intent(in) :: type
    integer, intent(in) :: ndims
    integer(int64), intent(in) :: dims(:)
    logical, intent(in) :: contiguous
    integer, intent(out), optional :: ierr
    if (.not. check_array(name, ndims, contiguous, 'cairn_protect', ierr)) return
    if (ndims == 0) then
      call done(c_protect(h%ptr, c_str(name), addr, 1_c_size_t, type), 'cairn_protect', ierr)
    else
      ! Fortran order, fastest-varying first: recorded as column-major.
      call done(c_protect_shaped(h%ptr, c_str(name), addr, type, int(ndims, c_int), dims, 1_c_int), &
                'cairn_protect', ierr)
    end if
  end subroutine protect_any

  ! False (after reporting the error) for an array cairn cannot keep in place.
  logical function check_array(name, ndims, contiguous, what, ierr) result(ok)
    character(len=*), intent(in) :: name, what
    integer, intent(in) :: ndims
    logical, intent(in) :: contiguous
    integer, intent(out), optional :: ierr
    character(len=16) :: buf
    ok = .false.
    if (.not. contiguous) then
      call fail(CAIRN_EINVAL, what//": region '"//trim(name)//"': the array is not contiguous in memory "// &
                "(a section with a stride such as a(1:n:2) or a(i,:), or a pointer to one); cairn reads "// &
                "and restores protected arrays in place, so protect a contiguous array (a whole array, "// &
                "or a section of whole leading dimensions such as a(:,j1:j2)), or copy the section into "// &
                "one and protect that", what, ierr)
      return
    end if
    if (ndims > CAIRN_MAX_DIMS) then
      write (buf, '(i0)') ndims
      call fail(CAIRN_EINVAL, what//": region '"//trim(name)//"': rank "//trim(buf)// &
                " is more than cairn records (8 dimensions); reshape it to at most 8 dimensions "// &
                "through a pointer (p(1:n1,...) => a) and protect that", what, ierr)
      return
    end if
    ok = .true.
  end function check_array

  subroutine protect_block_r4(h, name, a, global_shape, start, count, mem_start, ierr)
    type(cairn_t), intent(in) :: h
    character(len=*), intent(in) :: name
    real(real32), dimension(..), target :: a
    integer(int64), intent(in) :: global_shape(:), start(:), count(:)
    integer(int64), intent(in), optional :: mem_start(:)
    integer, intent(out), optional :: ierr
    call protect_block_any(h, name, c_loc(a), T_FLOAT32, rank(a), shape(a, kind=int64), is_contiguous(a), &
                           global_shape, start, count, mem_start, ierr)
  end subroutine protect_block_r4

  subroutine protect_block_r8(h, name, a, global_shape, start, count, mem_start, ierr)
    type(cairn_t), intent(in) :: h
    character(len=*), intent(in) :: name
    real(real64), dimension(..), target :: a
    integer(int64), intent(in) :: global_shape(:), start(:), count(:)
    integer(int64), intent(in), optional :: mem_start(:)
    integer, intent(out), optional :: ierr
    call protect_block_any(h, name, c_loc(a), T_FLOAT64, rank(a), shape(a, kind=int64), is_contiguous(a), &
                           global_shape, start, count, mem_start, ierr)
  end subroutine protect_block_r8

  subroutine protect_block_i4(h, name, a, global_shape, start, count, mem_start, ierr)
    type(cairn_t), intent(in) :: h
    character(len=*), intent(in) :: name
    integer(int32), dimension(..), target :: a
    integer(int64), intent(in) :: global_shape(:), start(:), count(:)
    integer(int64), intent(in), optional :: mem_start(:)
    integer, intent(out), optional :: ierr
    call protect_block_any(h, name, c_loc(a), T_INT32, rank(a), shape(a, kind=int64), is_contiguous(a), &
                           global_shape, start, count, mem_start, ierr)
  end subroutine protect_block_i4

  subroutine protect_block_i8(h, name, a, global_shape, start, count, mem_start, ierr)
    type(cairn_t), intent(in) :: h
    character(len=*), intent(in) :: name
    integer(int64), dimension(..), target :: a
    integer(int64), intent(in) :: global_shape(:), start(:), count(:)
    integer(int64), intent(in), optional :: mem_start(:)
    integer, intent(out), optional :: ierr
    call protect_block_any(h, name, c_loc(a), T_INT64, rank(a), shape(a, kind=int64), is_contiguous(a), &
                           global_shape, start, count, mem_start, ierr)
  end subroutine protect_block_i8

  subroutine protect_block_any(h, name, addr, type, ndims, dims, contiguous, global_shape, start, count, &
                               mem_start, ierr)
    type(cairn_t), intent(in) :: h
    character(len=*), intent(in) :: name
    type(c_ptr), intent(in) :: addr
    integer(c_int), intent(in) :: type
    integer, intent(in) :: ndims
    integer(int64), intent(in) :: dims(:)
    logical, intent(in) :: contiguous
    integer(int64), intent(in) :: global_shape(:), start(:), count(:)
    integer(int64), intent(in), optional :: mem_start(:)
    integer, intent(out), optional :: ierr
    integer(c_int64_t), target :: mem_shape_c(CAIRN_MAX_DIMS), mem_start_c(CAIRN_MAX_DIMS)
    type(c_ptr) :: mem_shape_ptr, mem_start_ptr
    logical :: sizes_ok
    if (.not. check_array(name, ndims, contiguous, 'cairn_protect_block', ierr)) return
    sizes_ok = ndims >= 1 .and. size(global_shape) == ndims .and. size(start) == ndims .and. &
               size(count) == ndims
    if (present(mem_start)) sizes_ok = sizes_ok .and. size(mem_start) == ndims
    if (.not. sizes_ok) then
      call fail(CAIRN_EINVAL, "cairn_protect_block: region '"//trim(name)//"': global_shape, start, count "// &
                "(and mem_start) need one entry per dimension of the array, which must have 1 to 8", &
                'cairn_protect_block', ierr)
      return
    end if
    mem_shape_ptr = c_null_ptr
    mem_start_ptr = c_null_ptr
    if (present(mem_start)) then
      mem_shape_c(1:ndims) = dims(1:ndims)
      mem_start_c(1:ndims) = mem_start(1:ndims)
      mem_shape_ptr = c_loc(mem_shape_c)
      mem_start_ptr = c_loc(mem_start_c)
    end if
    call done(c_protect_block(h%ptr, c_str(name), addr, type, int(ndims, c_int), global_shape, start, count, &
                              mem_shape_ptr, mem_start_ptr, 1_c_int), 'cairn_protect_block', ierr)
  end subroutine protect_block_any

  subroutine cairn_unprotect(h, name, ierr)
    type(cairn_t), intent(in) :: h
    character(len=*), intent(in) :: name
    integer, intent(out), optional :: ierr
    call done(c_unprotect(h%ptr, c_str(name)), 'cairn_unprotect', ierr)
  end subroutine cairn_unprotect

  ! ---- checkpoint and restart -----------------------------------------------------

  ! Collective. Captures every protected array as `version` of checkpoint `name`.
  subroutine cairn_checkpoint(h, name, version, ierr)
    type(cairn_t), intent(in) :: h
    character(len=*), intent(in) :: name
    integer(int64), intent(in) :: version
    integer, intent(out), optional :: ierr
    call done(c_checkpoint(h%ptr, c_str(name), int(version, c_int64_t)), 'cairn_checkpoint', ierr)
  end subroutine cairn_checkpoint

  ! Local. levels: the CAIRN_LEVEL_* bits this rank's part has reached
  ! (iand(levels, CAIRN_LEVEL_PERSISTENT) /= 0 once committed).
  subroutine cairn_test(h, name, version, levels, ierr)
    type(cairn_t), intent(in) :: h
    character(len=*), intent(in) :: name
    integer(int64), intent(in) :: version
    integer, intent(out) :: levels
    integer, intent(out), optional :: ierr
    integer(c_int) :: l
    l = 0
    call done(c_test(h%ptr, c_str(name), int(version, c_int64_t), l), 'cairn_test', ierr)
    levels = int(l)
  end subroutine cairn_test

  ! Collective. Blocks until the version has reached `level` (one CAIRN_LEVEL_* bit).
  subroutine cairn_wait(h, name, version, level, ierr)
    type(cairn_t), intent(in) :: h
    character(len=*), intent(in) :: name
    integer(int64), intent(in) :: version
    integer, intent(in) :: level
    integer, intent(out), optional :: ierr
    call done(c_wait(h%ptr, c_str(name), int(version, c_int64_t), int(level, c_int)), 'cairn_wait', ierr)
  end subroutine cairn_wait

  ! Collective. The newest version every rank can restore; ierr = CAIRN_ENOTFOUND
  ! when there is none, CAIRN_EUNUSABLE when there are some this job cannot use.
  subroutine cairn_restart_test(h, name, version, ierr)
    type(cairn_t), intent(in) :: h
    character(len=*), intent(in) :: name
    integer(int64), intent(out) :: version
    integer, intent(out), optional :: ierr
    integer(c_int64_t) :: v
    v = -1
    call done(c_restart_test(h%ptr, c_str(name), v), 'cairn_restart_test', ierr)
    version = int(v, int64)
  end subroutine cairn_restart_test

  ! Collective. Restores `version` of `name` into the protected arrays.
  subroutine cairn_restart(h, name, version, ierr)
    type(cairn_t), intent(in) :: h
    character(len=*), intent(in) :: name
    integer(int64), intent(in) :: version
    integer, intent(out), optional :: ierr
    call done(c_restart(h%ptr, c_str(name), int(version, c_int64_t)), 'cairn_restart', ierr)
  end subroutine cairn_restart

  subroutine cairn_set_code_version(h, code_version, ierr)
    type(cairn_t), intent(in) :: h
    character(len=*), intent(in) :: code_version
    integer, intent(out), optional :: ierr
    call done(c_set_code_version(h%ptr, c_str(code_version)), 'cairn_set_code_version', ierr)
  end subroutine cairn_set_code_version

  subroutine cairn_tag(h, key, value, ierr)
    type(cairn_t), intent(in) :: h
    character(len=*), intent(in) :: key, value
    integer, intent(out), optional :: ierr
    call done(c_tag(h%ptr, c_str(key), c_str(value)), 'cairn_tag', ierr)
  end subroutine cairn_tag

  ! ---- file mode -------------------------------------------------------------------
  ! cairn_checkpoint_begin; cairn_route_file for each file (write it at the
  ! routed path); cairn_checkpoint_end(success). Restart: cairn_restart_begin;
  ! cairn_route_file (read from the routed path); cairn_restart_end.

  subroutine cairn_checkpoint_begin(h, name, version, ierr)
    type(cairn_t), intent(in) :: h
    character(len=*), intent(in) :: name
    integer(int64), intent(in) :: version
    integer, intent(out), optional :: ierr
    call done(c_checkpoint_begin(h%ptr, c_str(name), int(version, c_int64_t)), 'cairn_checkpoint_begin', ierr)
  end subroutine cairn_checkpoint_begin

  ! routed receives the path to use for `file`; CAIRN_EINVAL if it is too short.
  subroutine cairn_route_file(h, file, routed, ierr)
    type(cairn_t), intent(in) :: h
    character(len=*), intent(in) :: file
    character(len=*), intent(out) :: routed
    integer, intent(out), optional :: ierr
    character(kind=c_char) :: buf(4097)
    integer(c_int) :: rc
    integer :: n
    character(len=24) :: have, need
    routed = ''
    rc = c_route_file(h%ptr, c_str(file), buf, int(size(buf), c_size_t))
    if (rc /= CAIRN_OK) then
      call done(rc, 'cairn_route_file', ierr)
      return
    end if
    n = 0
    do while (n < size(buf))
      if (buf(n + 1) == c_null_char) exit
      n = n + 1
    end do
    if (n > len(routed)) then
      write (have, '(i0)') len(routed)
      write (need, '(i0)') n
      call fail(CAIRN_EINVAL, "cairn_route_file: the routed path of '"//trim(file)//"' has "//trim(need)// &
                " characters, more than the "//trim(have)//" of the variable given for it: pass a longer one", &
                'cairn_route_file', ierr)
      return
    end if
    routed = transfer(buf(1:n), routed(1:n))
    call done(rc, 'cairn_route_file', ierr)
  end subroutine cairn_route_file

  subroutine cairn_checkpoint_end(h, success, ierr)
    type(cairn_t), intent(in) :: h
    logical, intent(in) :: success
    integer, intent(out), optional :: ierr
    call done(c_checkpoint_end(h%ptr, merge(1_c_int, 0_c_int, success)), 'cairn_checkpoint_end', ierr)
  end subroutine cairn_checkpoint_end

  subroutine cairn_restart_begin(h, name, version, ierr)
    type(cairn_t), intent(in) :: h
    character(len=*), intent(in) :: name
    integer(int64), intent(in) :: version
    integer, intent(out), optional :: ierr
    call done(c_restart_begin(h%ptr, c_str(name), int(version, c_int64_t)), 'cairn_restart_begin', ierr)
  end subroutine cairn_restart_begin

  subroutine cairn_restart_end(h, success, ierr)
    type(cairn_t), intent(in) :: h
    logical, intent(in) :: success
    integer, intent(out), optional :: ierr
    call done(c_restart_end(h%ptr, merge(1_c_int, 0_c_int, success)), 'cairn_restart_end', ierr)
  end subroutine cairn_restart_end

end module cairn
