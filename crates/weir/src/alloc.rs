//! The process allocator: the system allocator, except that single allocations of 1 GiB or more
//! are served by an `mmap(MAP_NORESERVE)` mapping.
//!
//! Why: decoders size vectors from counts declared in the input before reading the elements
//! (the `kafka-protocol` crate does `Vec::with_capacity(declared_len)` for arrays, and so does
//! record-batch decoding for record counts). A 30-byte request declaring 2^31 elements asks for
//! hundreds of GB in one call; the kernel's overcommit heuristic refuses it and Rust aborts the
//! whole broker. A `MAP_NORESERVE` mapping only reserves address space: pages cost memory when
//! touched, so the decoder fails cleanly at the end of the real input and the mapping is
//! released. Nothing legitimate in Weir makes single allocations this large (frames are bounded
//! by `socket.request.max.bytes`), so this path only ever serves such lies.
//!
//! [`keep_freed_memory`] also tunes glibc's malloc so that request buffers are reused instead of
//! being handed back to the kernel and faulted in again for the next request.

use std::alloc::{GlobalAlloc, Layout, System};

/// Allocations above this come straight from `mmap` and go back to the kernel when freed.
const MMAP_THRESHOLD: i32 = 32 << 20;
/// Free memory at the top of a malloc heap is returned to the kernel past this much.
const TRIM_THRESHOLD: i32 = 16 << 20;

/// Keeps the buffers of requests (a produce frame is typically 1 MiB) in malloc's heaps when
/// they are freed. Call it first thing in `main`, before any thread allocates.
///
/// glibc's default serves anything above 128 KiB with its own `mmap` and returns the heap's
/// top to the kernel past 128 KiB, adjusting both upwards only as large blocks are freed (to
/// 1 MiB and 2 MiB with 1 MiB frames). Each frame then arrived in fresh pages, and the kernel's
/// copy from the socket took a page fault every 4 KiB: 220,000 faults per 3 GB produced and a
/// quarter of the broker's CPU (`perf stat -e page-faults`, `weir bench produce`). With fixed
/// thresholds (glibc's own upper bound for the mmap one, 32 MiB) the frames come from the heap
/// and stay there; a heap still returns what it holds free beyond 16 MiB, which is a dozen
/// frames in flight (a 64 MiB threshold saved no more CPU and held more memory).
///
/// False if glibc refused a value (not expected; the broker works either way, only slower).
pub fn keep_freed_memory() -> bool {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only changes two of malloc's parameters; it is called before any other
    // thread exists, and glibc serialises it with allocations anyway.
    #[allow(unsafe_code)]
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1
            && libc::mallopt(libc::M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    true
}

const HUGE: usize = 1 << 30;
const PAGE: usize = 4096;

pub struct WeirAllocator;

fn is_huge(layout: &Layout) -> bool {
    layout.size() >= HUGE && layout.align() <= PAGE
}

// SAFETY: every method either forwards to `System` with the same layout, or, for huge layouts,
// uses a private anonymous mapping of exactly `layout.size()` bytes (page-aligned, so any
// alignment up to a page is met), released with `munmap` of the same size. `dealloc` and
// `realloc` tell the two apart by the layout's size, which the caller must pass unchanged.
#[allow(unsafe_code)]
unsafe impl GlobalAlloc for WeirAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if is_huge(&layout) {
            // SAFETY: an anonymous private mapping with no address hint has no preconditions.
            let ptr = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    layout.size(),
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                    -1,
                    0,
                )
            };
            if ptr == libc::MAP_FAILED {
                std::ptr::null_mut()
            } else {
                ptr.cast()
            }
        } else {
            // SAFETY: forwarded with the caller's guarantees.
            unsafe { System.alloc(layout) }
        }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if is_huge(&layout) {
            // SAFETY: as `alloc`; anonymous mappings are zero-filled.
            unsafe { self.alloc(layout) }
        } else {
            // SAFETY: forwarded with the caller's guarantees.
            unsafe { System.alloc_zeroed(layout) }
        }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        if is_huge(&layout) {
            // SAFETY: `ptr` came from our mmap of `layout.size()` bytes.
            unsafe {
                libc::munmap(ptr.cast(), layout.size());
            }
        } else {
            // SAFETY: forwarded with the caller's guarantees.
            unsafe { System.dealloc(ptr, layout) }
        }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let Ok(new_layout) = Layout::from_size_align(new_size, layout.align()) else {
            return std::ptr::null_mut();
        };
        if !is_huge(&layout) && !is_huge(&new_layout) {
            // SAFETY: both sizes are System's; forwarded with the caller's guarantees.
            return unsafe { System.realloc(ptr, layout, new_size) };
        }
        // Crossing into or out of the mapped range: move the bytes.
        // SAFETY: `new_layout` is valid; the copy covers the smaller of the two live sizes; the
        // old block is released with its own layout.
        unsafe {
            let new_ptr = self.alloc(new_layout);
            if !new_ptr.is_null() {
                std::ptr::copy_nonoverlapping(ptr, new_ptr, layout.size().min(new_size));
                self.dealloc(ptr, layout);
            }
            new_ptr
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn glibc_takes_the_malloc_thresholds() {
        assert!(super::keep_freed_memory());
    }

    #[test]
    fn a_declared_but_unused_huge_capacity_does_not_abort() {
        // 256 GiB of address space, never touched: refused by the overcommit heuristic if it
        // went to the system allocator.
        let mut v: Vec<u64> = Vec::with_capacity(1 << 35);
        v.extend([1, 2, 3]);
        // Shrinking moves the live elements out of the mapping (realloc across the threshold).
        v.shrink_to_fit();
        assert_eq!(v, vec![1, 2, 3]);
        let mut bytes: Vec<u8> = Vec::with_capacity(16);
        bytes.extend_from_slice(b"abc");
        bytes.reserve_exact(super::HUGE);
        assert_eq!(&bytes[..], b"abc");
    }
}
