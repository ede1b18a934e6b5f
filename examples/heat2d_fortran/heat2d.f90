! heat2d_fortran: Jacobi solver for the 2-D heat equation in Fortran (mpi_f08),
! checkpointed with the cairn module (`use cairn`).
!
! The global interior grid has NX rows and NY columns, stored column-major.
! It is split into blocks of whole columns, one per rank (the first NY % P
! ranks get one column more), so that the halo columns exchanged with the
! neighbours are contiguous. Each rank stores u(0:NX+1, 0:cols+1): its columns
! plus one halo column left and right, and the fixed boundary rows 0 (hot,
! 1.0) and NX+1 (0.0). The columns left and right of the global grid are 0.0.
!
! Each iteration exchanges halo columns with MPI_Sendrecv and computes
!   v(i,j) = 0.25 * ((u(i-1,j) + u(i+1,j)) + (u(i,j-1) + u(i,j+1)))
! for every interior point, then switches to the other grid (double
! buffering). Every point sees the same operands in the same order whatever
! the rank count, and whether or not the run was interrupted and restarted,
! so the result is bit-identical in all these cases.
!
! Checkpointed state (checkpoint "heat2d_f", version = completed iterations):
!   grid  real(real64), the block of the global NX x NY interior this rank
!         holds (cairn_protect_block: global start column = this rank's first
!         column, the block at (1, 1) of the local grid, halos not stored).
!         The two grids are g(:,:,1) and g(:,:,2); the current one is
!         protected again before every checkpoint (the double-buffer rule),
!         and a restart restores into g(:,:,1).
!   iter  integer(int64)(3) on every rank: completed iterations, NX, NY
!
! Options: --nx N --ny N --iters N --every K --sleep-ms M --config PATH
!          --dump DIR (each rank writes its final interior, column-major
!          doubles, to DIR/heat2d_f.RANK.bin)
! Output on rank 0: "heat2d_f: starting from scratch" or "heat2d_f: restarted
! from version V", "heat2d_f: checkpoint version V" after each checkpoint,
! "heat2d_f: done N iterations" at the end.
program heat2d_fortran
  use, intrinsic :: iso_fortran_env, only: real64, int64, output_unit, error_unit
  use, intrinsic :: iso_c_binding, only: c_int
  use mpi_f08
  use cairn
  implicit none

  character(len=*), parameter :: ckpt_name = 'heat2d_f'
  integer :: rank, nranks, ierr, left, right, cur, nxt, i, j
  integer(int64) :: nx, ny, iters, every, sleep_ms, it, cols, first_col, base, rem, version
  integer(int64), target :: state(3)
  real(real64), allocatable, target :: g(:,:,:)
  character(len=4096) :: config, dump_dir, fname
  type(cairn_t) :: h

  call MPI_Init()
  call MPI_Comm_rank(MPI_COMM_WORLD, rank)
  call MPI_Comm_size(MPI_COMM_WORLD, nranks)
  call parse_options()
  if (ny < nranks) call die('--ny is smaller than the number of ranks')

  base = ny / nranks
  rem = mod(ny, int(nranks, int64))
  cols = base + merge(1_int64, 0_int64, rank < rem)
  first_col = rank * base + min(int(rank, int64), rem)
  left = merge(rank - 1, MPI_PROC_NULL, rank > 0)
  right = merge(rank + 1, MPI_PROC_NULL, rank < nranks - 1)

  ! Both grids: fixed boundaries everywhere they are never overwritten (also
  ! after a restart, which restores only the interior).
  allocate (g(0:nx + 1, 0:cols + 1, 2))
  g = 0.0_real64
  g(0, :, :) = 1.0_real64
  state = [0_int64, nx, ny]

  if (len_trim(config) > 0) then
    call cairn_init_mpi(h, MPI_COMM_WORLD, trim(config))
  else
    call cairn_init_mpi(h, MPI_COMM_WORLD)
  end if
  cur = 1
  call protect_grid(cur)
  call cairn_protect(h, 'iter', state)

  call cairn_restart_test(h, ckpt_name, version, ierr)
  if (ierr == CAIRN_OK) then
    call cairn_restart(h, ckpt_name, version)
    if (state(2) /= nx .or. state(3) /= ny) &
      call die('the checkpoint is of another grid size: rerun with the same --nx/--ny or remove the store')
    if (rank == 0) write (output_unit, '(a,i0)') 'heat2d_f: restarted from version ', version
  else if (ierr == CAIRN_ENOTFOUND) then
    if (rank == 0) write (output_unit, '(a)') 'heat2d_f: starting from scratch'
  else
    call die('cairn_restart_test: '//cairn_strerror(ierr)//': '//cairn_last_error())
  end if
  flush (output_unit)

  do it = state(1) + 1, iters
    nxt = 3 - cur
    ! Halo columns: the first column goes left while the right halo comes from
    ! the right, then the other way. MPI_PROC_NULL leaves the fixed boundary
    ! columns of the first and last rank as they are.
    call MPI_Sendrecv(g(1:nx, 1, cur), int(nx), MPI_DOUBLE_PRECISION, left, 0, &
                      g(1:nx, cols + 1, cur), int(nx), MPI_DOUBLE_PRECISION, right, 0, &
                      MPI_COMM_WORLD, MPI_STATUS_IGNORE)
    call MPI_Sendrecv(g(1:nx, cols, cur), int(nx), MPI_DOUBLE_PRECISION, right, 1, &
                      g(1:nx, 0, cur), int(nx), MPI_DOUBLE_PRECISION, left, 1, &
                      MPI_COMM_WORLD, MPI_STATUS_IGNORE)
    do j = 1, int(cols)
      do i = 1, int(nx)
        g(i, j, nxt) = 0.25_real64*((g(i - 1, j, cur) + g(i + 1, j, cur)) + (g(i, j - 1, cur) + g(i, j + 1, cur)))
      end do
    end do
    cur = nxt
    if (sleep_ms > 0) call pause_ms(sleep_ms)

    if (every > 0 .and. mod(it, every) == 0) then
      state(1) = it
      ! The current grid moved: protect it again before the checkpoint.
      call protect_grid(cur)
      call cairn_checkpoint(h, ckpt_name, it)
      if (rank == 0) write (output_unit, '(a,i0)') 'heat2d_f: checkpoint version ', it
      flush (output_unit)
    end if
  end do

  call cairn_finalize(h)

  if (len_trim(dump_dir) > 0) then
    write (fname, '(a,a,i0,a)') trim(dump_dir), '/heat2d_f.', rank, '.bin'
    open (newunit=i, file=trim(fname), access='stream', form='unformatted', status='replace', action='write')
    write (i) g(1:nx, 1:cols, cur)
    close (i)
  end if
  if (rank == 0) write (output_unit, '(a,i0,a)') 'heat2d_f: done ', iters, ' iterations'
  call MPI_Finalize()

contains

  subroutine protect_grid(which)
    integer, intent(in) :: which
    call cairn_protect_block(h, 'grid', g(:, :, which), global_shape=[nx, ny], start=[0_int64, first_col], &
                             count=[nx, cols], mem_start=[1_int64, 1_int64])
  end subroutine protect_grid

  subroutine die(message)
    character(len=*), intent(in) :: message
    write (error_unit, '(a)') 'heat2d_f: '//message
    flush (error_unit)
    call MPI_Abort(MPI_COMM_WORLD, 1)
  end subroutine die

  subroutine pause_ms(ms)
    integer(int64), intent(in) :: ms
    interface
      function usleep(us) bind(C, name='usleep') result(rc)
        import :: c_int
        integer(c_int), value :: us
        integer(c_int) :: rc
      end function usleep
    end interface
    integer(c_int) :: rc
    rc = usleep(int(ms*1000_int64, c_int))
  end subroutine pause_ms

  subroutine parse_options()
    integer :: k, n
    character(len=4096) :: arg, val
    nx = 64
    ny = 64
    iters = 200
    every = 10
    sleep_ms = 0
    config = ''
    dump_dir = ''
    n = command_argument_count()
    k = 1
    do while (k <= n)
      call get_command_argument(k, arg)
      if (k + 1 > n) call die('option '//trim(arg)//' needs a value')
      call get_command_argument(k + 1, val)
      select case (trim(arg))
      case ('--nx')
        nx = to_int(arg, val, 1_int64)
      case ('--ny')
        ny = to_int(arg, val, 1_int64)
      case ('--iters')
        iters = to_int(arg, val, 0_int64)
      case ('--every')
        every = to_int(arg, val, 0_int64)
      case ('--sleep-ms')
        sleep_ms = to_int(arg, val, 0_int64)
      case ('--config')
        config = val
      case ('--dump')
        dump_dir = val
      case default
        call die('unknown option '//trim(arg)// &
                 ' (options: --nx --ny --iters --every --sleep-ms --config --dump)')
      end select
      k = k + 2
    end do
  end subroutine parse_options

  integer(int64) function to_int(opt, text, min_value)
    character(len=*), intent(in) :: opt, text
    integer(int64), intent(in) :: min_value
    integer :: ios
    read (text, *, iostat=ios) to_int
    if (ios /= 0 .or. to_int < min_value) call die('invalid value '''//trim(text)//''' for '//trim(opt))
  end function to_int

end program heat2d_fortran
