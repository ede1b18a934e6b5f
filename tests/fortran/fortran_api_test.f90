! The Fortran module `cairn` end to end, under mpirun, with the integer MPI
! handles of `use mpi` (the heat-equation example uses mpi_f08):
!  - every supported kind, ranks 0 (scalar) to 8, a contiguous section;
!    checkpoint, test, wait, restart_test, restart: restored bit for bit;
!  - refused: a non-contiguous section (CAIRN_EINVAL, a message naming the
!    region and what to do) and a rank beyond 8; nothing registered by them;
!  - restart_test of a fresh store: CAIRN_ENOTFOUND;
!  - the file mode, and route_file into too short a variable.
! Driven by tests/fortran/test_fortran.py, which also reads the shapes cairn
! recorded (`cairn show --json`). Prints "fortran_api_test: ok" on rank 0.
program fortran_api_test
  use, intrinsic :: iso_fortran_env, only: real32, real64, int32, int64, output_unit, error_unit
  use mpi
  use cairn
  implicit none

  type(cairn_t) :: h
  integer :: ierr, rank, levels, u, i
  integer(int64) :: version
  real(real32), target :: r4(7), r4_saved(7)
  real(real64), allocatable, target :: r8(:,:,:), r8_saved(:,:,:)
  integer(int32), target :: i4(6, 5), i4_saved(6, 5)
  integer(int64), target :: i8, i8_saved
  real(real64), target :: wide(4, 6), wide_saved(4, 6)
  real(real32), target :: r8d(2, 1, 2, 1, 2, 1, 2, 1), r8d_saved(2, 1, 2, 1, 2, 1, 2, 1)
  real(real32), target :: r9(1, 1, 1, 1, 1, 1, 1, 1, 2)
  real(real64), target :: strided(10)
  character(len=4096) :: routed
  character(len=8) :: short
  character(len=64) :: line

  call MPI_Init(ierr)
  call MPI_Comm_rank(MPI_COMM_WORLD, rank, ierr)

  call cairn_init_mpi(h, MPI_COMM_WORLD, ierr=ierr)
  call check(ierr == CAIRN_OK, 'cairn_init_mpi with an integer handle')
  call check(cairn_rank(h) == rank, 'cairn_rank')

  call cairn_restart_test(h, 'api', version, ierr)
  call check(ierr == CAIRN_ENOTFOUND, 'restart_test of a fresh store gives CAIRN_ENOTFOUND')
  call check(len(cairn_strerror(CAIRN_ENOTFOUND)) > 0, 'cairn_strerror')

  ! Data that differs per rank and per element.
  allocate (r8(3, 4, 5), r8_saved(3, 4, 5))
  r4 = [(real(i, real32)/3.0_real32 + rank, i=1, 7)]
  r8 = reshape([(real(i, real64)/7.0_real64 - rank, i=1, 60)], [3, 4, 5])
  i4 = reshape([(i*(rank + 1), i=1, 30)], [6, 5])
  i8 = 9000000000_int64 + rank
  wide = reshape([(real(i, real64)*1.5_real64 + rank, i=1, 24)], [4, 6])
  r8d = reshape([(real(i, real32) + rank, i=1, 16)], shape(r8d))

  call cairn_protect(h, 'r4', r4)
  call cairn_protect(h, 'r8', r8)
  call cairn_protect(h, 'i4', i4)
  call cairn_protect(h, 'i8', i8)
  call cairn_protect(h, 'cols', wide(:, 2:4))   ! whole columns: contiguous
  call cairn_protect(h, 'rank8', r8d)

  ! Refused: strided sections and a rank beyond 8.
  call cairn_protect(h, 'bad_stride', strided(1:10:2), ierr)
  call check(ierr == CAIRN_EINVAL, 'a strided section is refused with CAIRN_EINVAL')
  call check(index(cairn_last_error(), "region 'bad_stride'") > 0 .and. &
             index(cairn_last_error(), 'not contiguous') > 0, 'the message names the region and the cause')
  if (rank == 0) write (output_unit, '(a)') 'refused: '//cairn_last_error()
  call cairn_protect(h, 'bad_row', wide(2, :), ierr)
  call check(ierr == CAIRN_EINVAL, 'a row of a column-major array is refused')
  call cairn_protect(h, 'bad_rank', r9, ierr)
  call check(ierr == CAIRN_EINVAL .and. index(cairn_last_error(), 'rank 9') > 0, 'rank 9 is refused')
  ! A refusal leaves no trace: removing the region it named finds none.
  call cairn_unprotect(h, 'bad_stride', ierr)
  call check(ierr /= CAIRN_OK, 'the refused region was not registered')

  r4_saved = r4
  r8_saved = r8
  i4_saved = i4
  i8_saved = i8
  wide_saved = wide
  r8d_saved = r8d

  call cairn_checkpoint(h, 'api', 1_int64)
  call cairn_wait(h, 'api', 1_int64, CAIRN_LEVEL_PERSISTENT)
  call cairn_test(h, 'api', 1_int64, levels)
  call check(iand(levels, CAIRN_LEVEL_PERSISTENT) /= 0, 'cairn_test reports the persistent level')

  r4 = -1
  r8 = -1
  i4 = -1
  i8 = -1
  wide = -1
  r8d = -1
  call cairn_restart_test(h, 'api', version)
  call check(version == 1, 'restart_test finds version 1')
  call cairn_restart(h, 'api', version)
  call check(all(transfer(r4, 0_int32, size(r4)) == transfer(r4_saved, 0_int32, size(r4))), 'r4 restored')
  call check(all(transfer(r8, 0_int64, size(r8)) == transfer(r8_saved, 0_int64, size(r8))), 'r8 restored')
  call check(all(i4 == i4_saved), 'i4 restored')
  call check(i8 == i8_saved, 'i8 (scalar) restored')
  call check(all(transfer(wide(:, 2:4), 0_int64, 12) == transfer(wide_saved(:, 2:4), 0_int64, 12)), &
             'the section restored')
  call check(all(wide(:, 1) == -1) .and. all(wide(:, 5:6) == -1), 'nothing written outside the section')
  call check(all(r8d == r8d_saved), 'rank 8 restored')

  ! File mode.
  call cairn_checkpoint_begin(h, 'files', 1_int64)
  call cairn_route_file(h, 'state.txt', routed)
  open (newunit=u, file=trim(routed), status='replace', action='write')
  write (u, '(a,i0)') 'rank ', rank
  close (u)
  call cairn_route_file(h, 'state.txt', short, ierr)
  call check(ierr == CAIRN_EINVAL .and. index(cairn_last_error(), 'pass a longer one') > 0, &
             'route_file into too short a variable')
  call cairn_checkpoint_end(h, .true.)
  call cairn_wait(h, 'files', 1_int64, CAIRN_LEVEL_PERSISTENT)
  call cairn_restart_begin(h, 'files', 1_int64)
  call cairn_route_file(h, 'state.txt', routed)
  open (newunit=u, file=trim(routed), status='old', action='read')
  read (u, '(a)') line
  close (u)
  call cairn_restart_end(h, .true.)
  write (short, '(i0)') rank
  call check(trim(line) == 'rank '//trim(short), 'file mode round trip')

  call cairn_finalize(h, ierr=ierr)
  call check(ierr == CAIRN_OK, 'cairn_finalize')
  if (rank == 0) write (output_unit, '(a)') 'fortran_api_test: ok'
  call MPI_Finalize(ierr)

contains

  subroutine check(ok, what)
    logical, intent(in) :: ok
    character(len=*), intent(in) :: what
    if (.not. ok) then
      write (error_unit, '(a,i0,a)') 'fortran_api_test: rank ', rank, ': FAILED: '//what// &
        ' (last error: '//cairn_last_error()//')'
      flush (error_unit)
      error stop 1
    end if
  end subroutine check

end program fortran_api_test
