! ckpt_loop_f (Fortran): the loop of ckpt_loop.c through the cairn module
! (use cairn), for bench/run_fortran_vs_c.py.
! usage: ckpt_loop_f MIB VERSIONS  -> prints "blocked_ms <v1> <v2> ..."
program ckpt_loop_f
  use, intrinsic :: iso_fortran_env, only: real64, int64
  use cairn
  implicit none
  type(cairn_t) :: h
  real(real64), allocatable :: x(:)
  character(len=32) :: arg
  integer(int64) :: n, i, v, t0, t1, rate
  integer :: mib, versions
  call get_command_argument(1, arg)
  read (arg, *) mib
  call get_command_argument(2, arg)
  read (arg, *) versions
  n = int(mib, int64) * 1024 * 1024 / 8
  allocate (x(n))
  do i = 1, n
    x(i) = real(i - 1, real64) * 0.5_real64
  end do
  call cairn_init(h)
  call cairn_protect(h, 'x', x)
  write (*, '(a)', advance='no') 'blocked_ms'
  do v = 1, versions
    x(v + 1) = x(v + 1) + 1.0_real64
    call system_clock(t0, rate)
    call cairn_checkpoint(h, 'b', v)
    call system_clock(t1)
    call cairn_wait(h, 'b', v, CAIRN_LEVEL_PERSISTENT)
    write (*, '(a,f0.3)', advance='no') ' ', real(t1 - t0, real64) * 1e3_real64 / real(rate, real64)
  end do
  write (*, '(a)') ''
  call cairn_finalize(h)
end program ckpt_loop_f
