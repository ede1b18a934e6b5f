! An SCR application in Fortran, in the style of SCR's examples/test_ckpt.F90,
! built with nothing but -I and -l pointing at the drop-in (INCLUDE 'scrf.h',
! -lscrf -lscr). It restarts from the newest dataset if there is one, checking
! every value it reads, then writes LOOPS datasets "ckpt_<n>" of an array per
! rank through SCR_ROUTE_FILE. Rank 0 prints "restarted from <name>" or
! "no restart", "checkpoint <name>" for each dataset, then "errors <n>".
!   scr_ckpt [LOOPS]   (default 3)
program scr_ckpt
  implicit none
  include 'mpif.h'
  include 'scrf.h'
  integer, parameter :: n = 4096
  integer(kind=8) :: w(n), r(n)
  character(len=SCR_MAX_FILENAME) :: dset, routed, cfg
  character(len=32) :: file, arg
  integer :: ierr, rank, flag, valid, loop, first, loops, i, errors, total, unit, ios

  call mpi_init(ierr)
  call mpi_comm_rank(MPI_COMM_WORLD, rank, ierr)
  loops = 3
  if (command_argument_count() >= 1) then
    call get_command_argument(1, arg)
    read (arg, *) loops
  end if
  ! SCR_CONFIG before SCR_INIT, as SCR's Fortran examples may.
  call scr_config('SCR_CACHE_SIZE=2', cfg, ierr)
  if (ierr /= SCR_SUCCESS) call fail('SCR_CONFIG')
  call scr_init(ierr)
  if (ierr /= SCR_SUCCESS) call fail('SCR_INIT')
  write (file, '(a,i5.5,a)') 'rank_', rank, '.ckpt'
  errors = 0
  first = 1

  call scr_have_restart(flag, dset, ierr)
  if (ierr /= SCR_SUCCESS) call fail('SCR_HAVE_RESTART')
  if (flag == 1) then
    call scr_start_restart(dset, ierr)
    if (ierr /= SCR_SUCCESS) call fail('SCR_START_RESTART')
    call scr_route_file(trim(dset)//'/'//trim(file), routed, ierr)
    r = 0
    open (newunit=unit, file=trim(routed), form='unformatted', action='read', status='old', iostat=ios)
    if (ios == 0) then
      read (unit, iostat=ios) r
      close (unit)
    end if
    read (dset(6:), *) first  ! "ckpt_<n>"
    do i = 1, n
      if (r(i) /= expected(first, i)) errors = errors + 1
    end do
    valid = 0
    if (ierr == SCR_SUCCESS .and. ios == 0 .and. errors == 0) valid = 1
    call scr_complete_restart(valid, ierr)
    if (ierr /= SCR_SUCCESS) call fail('SCR_COMPLETE_RESTART')
    if (rank == 0) print '(a,a)', 'restarted from ', trim(dset)
    first = first + 1
  else
    if (rank == 0) print '(a)', 'no restart'
  end if

  do loop = first, first + loops - 1
    do i = 1, n
      w(i) = expected(loop, i)
    end do
    write (dset, '(a,i5.5)') 'ckpt_', loop
    call scr_start_output(dset, SCR_FLAG_CHECKPOINT, ierr)
    if (ierr /= SCR_SUCCESS) call fail('SCR_START_OUTPUT')
    call scr_route_file(trim(dset)//'/'//trim(file), routed, ierr)
    if (ierr /= SCR_SUCCESS) call fail('SCR_ROUTE_FILE')
    open (newunit=unit, file=trim(routed), form='unformatted', action='write', status='replace', iostat=ios)
    if (ios == 0) then
      write (unit, iostat=ios) w
      close (unit)
    end if
    valid = 0
    if (ios == 0) valid = 1
    call scr_complete_output(valid, ierr)
    if (ierr /= SCR_SUCCESS) call fail('SCR_COMPLETE_OUTPUT')
    if (rank == 0) print '(a,a)', 'checkpoint ', trim(dset)
  end do

  call mpi_allreduce(errors, total, 1, MPI_INTEGER, MPI_SUM, MPI_COMM_WORLD, ierr)
  if (rank == 0) print '(a,i0)', 'errors ', total
  call scr_finalize(ierr)
  if (ierr /= SCR_SUCCESS) call fail('SCR_FINALIZE')
  call mpi_finalize(ierr)

contains

  ! The value of element i of dataset `loop` on this rank.
  integer(kind=8) function expected(loop, i)
    integer, intent(in) :: loop, i
    expected = int(rank, 8) * 2_8**40 + int(loop, 8) * 2_8**20 + int(i, 8)
  end function

  subroutine fail(what)
    character(len=*), intent(in) :: what
    print '(a,i0,a,a,a,i0)', 'rank ', rank, ': ', what, ' failed: ', ierr
    call mpi_abort(MPI_COMM_WORLD, 3, ierr)
  end subroutine

end program scr_ckpt
