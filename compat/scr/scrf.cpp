// The SCR drop-in's Fortran interface: SCR's Fortran calls (SCR_INIT(ierr),
// SCR_HAVE_RESTART(flag, name, ierr), SCR_ROUTE_FILE(name, file, ierr), ...)
// as the symbols gfortran emits for them (lower case, one trailing underscore,
// the length of every CHARACTER argument appended as a size_t), over the C
// drop-in (scr.h). Strings in are taken without their trailing blanks;
// strings out are padded with blanks; one that does not fit fails the call
// (ierr != SCR_SUCCESS) rather than arrive cut.
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <string>

#include "scr.h"

namespace {

constexpr int kFailed = 1;  // any value but SCR_SUCCESS

std::string from_fortran(const char* s, size_t len) {
  while (len > 0 && (s[len - 1] == ' ' || s[len - 1] == '\0')) --len;
  return std::string(s, len);
}

// false when `c` is longer than the Fortran variable.
bool to_fortran(const char* c, char* f, size_t len) {
  const size_t n = std::strlen(c);
  if (n > len) return false;
  std::memcpy(f, c, n);
  std::memset(f + n, ' ', len - n);
  return true;
}

}  // namespace

extern "C" {

void scr_init_(int* ierr) { *ierr = SCR_Init(); }

void scr_finalize_(int* ierr) { *ierr = SCR_Finalize(); }

void scr_should_exit_(int* flag, int* ierr) { *ierr = SCR_Should_exit(flag); }

// SCR_CONFIG(cfg, val, ierr): sets "KEY=VALUE" (val blank), or returns KEY's
// value in val (ierr != SCR_SUCCESS when KEY has none).
void scr_config_(const char* cfg, char* val, int* ierr, size_t cfg_len, size_t val_len) {
  const std::string c = from_fortran(cfg, cfg_len);
  const char* v = SCR_Config(c.c_str());
  if (v == nullptr) {
    *ierr = c.find('=') == std::string::npos ? kFailed : SCR_SUCCESS;
    to_fortran("", val, val_len);
    return;
  }
  *ierr = to_fortran(v, val, val_len) ? SCR_SUCCESS : kFailed;
  std::free(const_cast<char*>(v));  // a copy (scr.h)
}

void scr_have_restart_(int* flag, char* name, int* ierr, size_t name_len) {
  char n[SCR_MAX_FILENAME] = {0};
  *ierr = SCR_Have_restart(flag, n);
  if (*ierr == SCR_SUCCESS && *flag && !to_fortran(n, name, name_len)) *ierr = kFailed;
}

void scr_start_restart_(char* name, int* ierr, size_t name_len) {
  char n[SCR_MAX_FILENAME] = {0};
  *ierr = SCR_Start_restart(n);
  if (*ierr == SCR_SUCCESS && !to_fortran(n, name, name_len)) *ierr = kFailed;
}

void scr_complete_restart_(const int* valid, int* ierr) { *ierr = SCR_Complete_restart(*valid); }

void scr_need_checkpoint_(int* flag, int* ierr) { *ierr = SCR_Need_checkpoint(flag); }

void scr_start_checkpoint_(int* ierr) { *ierr = SCR_Start_checkpoint(); }

void scr_complete_checkpoint_(const int* valid, int* ierr) { *ierr = SCR_Complete_checkpoint(*valid); }

void scr_start_output_(const char* name, const int* flags, int* ierr, size_t name_len) {
  *ierr = SCR_Start_output(from_fortran(name, name_len).c_str(), *flags);
}

void scr_complete_output_(const int* valid, int* ierr) { *ierr = SCR_Complete_output(*valid); }

void scr_route_file_(const char* name, char* file, int* ierr, size_t name_len, size_t file_len) {
  char out[SCR_MAX_FILENAME] = {0};
  *ierr = SCR_Route_file(from_fortran(name, name_len).c_str(), out);
  if (*ierr == SCR_SUCCESS && !to_fortran(out, file, file_len)) *ierr = kFailed;
}

void scr_current_(const char* name, int* ierr, size_t name_len) {
  *ierr = SCR_Current(from_fortran(name, name_len).c_str());
}

void scr_drop_(const char* name, int* ierr, size_t name_len) { *ierr = SCR_Drop(from_fortran(name, name_len).c_str()); }

void scr_delete_(const char* name, int* ierr, size_t name_len) {
  *ierr = SCR_Delete(from_fortran(name, name_len).c_str());
}

}  // extern "C"
