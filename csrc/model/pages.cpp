// release_pages (intdet/model.h), used by the loader and pack_model: part of
// intdet_loader, so every module that links the loader (_core, _cuda,
// intdet_run, the CUDA emulator) has it.
#include <cstdint>

#if defined(__unix__) || defined(__APPLE__)
#include <sys/mman.h>
#include <unistd.h>
#endif

#include "intdet/model.h"

namespace intdet {

// Whole pages inside [p, p + n) leave the process; for a read-only file
// mapping a later read faults them back in from the file.
void release_pages(const void* p, int64_t n) {
#if defined(__unix__) || defined(__APPLE__)
  const uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
  const uintptr_t lo = ((uintptr_t)p + page - 1) / page * page, hi = ((uintptr_t)p + (uintptr_t)n) / page * page;
  if (hi > lo) madvise((void*)lo, hi - lo, MADV_DONTNEED);
#else
  (void)p;
  (void)n;
#endif
}

}  // namespace intdet
