// Transparent huge pages for the sampler's large scratch buffers.
//
// The key tables (12 B per key, cluster and head: 50 MB at n = 16384, H = 2,
// k = 128) and the column sort's scratch (8 B per edge) are allocated afresh
// each call. The tables are read at random, a draw at a time: in 4 KB pages
// such a read misses the TLB as well as the caches, and each fresh 4 KB
// costs a page fault. Advised huge pages (Linux MADV_HUGEPAGE, honoured in
// transparent_hugepage's "madvise" and "always" modes) keep the tables'
// translations in the TLB and take one fault per 2 MB. The advice is asked
// before the first touch; where the kernel does not give huge pages the
// buffers work in small ones, unchanged. The edge-sized outputs are torch
// tensors and are not advised: with huge pages their calls' times varied
// more than they gained (docs/runs/cpu/sampler-huge-pages/).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <new>

#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace sbm_pyg {

constexpr size_t kHugePage = size_t(1) << 21;

// Advises huge pages for the 2 MB-aligned part of [p, p + bytes) (nothing
// below 4 MB, where at most one huge page would fit).
inline void advise_huge_pages(void* p, size_t bytes) {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  if (bytes < 2 * kHugePage) return;
  const uintptr_t begin = ((uintptr_t)p + kHugePage - 1) & ~(kHugePage - 1);
  const uintptr_t end = ((uintptr_t)p + bytes) & ~(kHugePage - 1);
  if (end > begin) madvise((void*)begin, end - begin, MADV_HUGEPAGE);
#else
  (void)p;
  (void)bytes;
#endif
}

// An uninitialised array of n trivially copyable T, 2 MB-aligned when large
// and advised; resize() keeps nothing (scratch only).
template <typename T>
class HugeArray {
 public:
  HugeArray() = default;
  explicit HugeArray(size_t n) { resize(n); }
  void resize(size_t n) {
    if (n <= capacity_) {
      size_ = n;
      return;
    }
    const size_t bytes = n * sizeof(T);
    const size_t align = bytes >= 2 * kHugePage ? kHugePage : 64;
    void* p = std::aligned_alloc(align, (bytes + align - 1) / align * align);
    if (p == nullptr) throw std::bad_alloc();
    advise_huge_pages(p, bytes);
    data_.reset(static_cast<T*>(p));
    size_ = capacity_ = n;
  }
  T* data() { return data_.get(); }
  const T* data() const { return data_.get(); }
  T& operator[](size_t i) { return data_.get()[i]; }
  const T& operator[](size_t i) const { return data_.get()[i]; }
  size_t size() const { return size_; }

 private:
  struct Free {
    void operator()(T* p) const { std::free(p); }
  };
  std::unique_ptr<T, Free> data_;
  size_t size_ = 0, capacity_ = 0;
};

}  // namespace sbm_pyg
