//! Software prefetch: asking the processor to start loading a cache line
//! whose address is known before it is read, so that several loads wait
//! for memory side by side instead of one after another. Used where a
//! pass reads memory in an order the hardware cannot guess: the GC's
//! lookups (`gc/graph.rs`), the records of an LMDB range scan and the
//! value of an LMDB `get` (`backend/lmdb`). A hint only: it changes no
//! result, and does nothing on targets other than x86_64.

/// Starts loading the cache line that holds `p`.
#[inline(always)]
pub(crate) fn prefetch<T>(p: &T) {
    prefetch_addr((p as *const T).cast());
}

/// Starts loading the cache line that holds address `p`, which need not
/// be mapped: the hint never faults and reads nothing into the program.
#[inline(always)]
#[allow(unsafe_code)]
pub(crate) fn prefetch_addr(p: *const u8) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `_mm_prefetch` needs SSE, part of x86_64's baseline. It is a
    // hint: it never dereferences `p` in the program's sense and never
    // faults, whatever the address.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(p.cast());
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}
