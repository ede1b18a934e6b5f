! The installed Fortran module: checkpoint a 3-D array and an integer array,
! restore them into cleared arrays and compare bit for bit. Runs as a single
! MPI process (no mpirun needed). Exits 0 only if the data came back.
program consumer_fortran
  use, intrinsic :: iso_fortran_env, only: real64, int32, int64
  use mpi_f08
  use cairn
  implicit none
  type(cairn_t) :: h
  real(real64), allocatable, target :: a(:,:,:), saved(:,:,:)
  integer(int32), target :: n(5)
  integer(int64) :: v
  integer :: i, ierr

  call MPI_Init()
  allocate (a(4, 3, 2), saved(4, 3, 2))
  a = reshape([(i*0.25_real64, i=1, 24)], shape(a))
  saved = a
  n = [1, 2, 3, 4, 5]
  call cairn_init_mpi(h, MPI_COMM_WORLD)
  call cairn_protect(h, 'a', a)
  call cairn_protect(h, 'n', n)
  call cairn_checkpoint(h, 'consumer_f', 3_int64)
  call cairn_wait(h, 'consumer_f', 3_int64, CAIRN_LEVEL_PERSISTENT)
  a = 0
  n = 0
  call cairn_restart_test(h, 'consumer_f', v, ierr)
  if (ierr /= CAIRN_OK) error stop 'consumer_fortran: restart_test failed'
  call cairn_restart(h, 'consumer_f', v)
  call cairn_finalize(h)
  if (v /= 3 .or. any(transfer(a, 0_int64, 24) /= transfer(saved, 0_int64, 24)) .or. &
      any(n /= [1, 2, 3, 4, 5])) error stop 'consumer_fortran: restored data differs'
  print '(a)', 'consumer_fortran: ok'
  call MPI_Finalize()
end program consumer_fortran
