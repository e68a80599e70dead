// The rule of a decode step's bookkeeping for one row (decode_record.py): shared by decode_record.cu
// (one token a row) and decode_accept.cu (a speculative step's accepted tokens, in order). bools are
// bytes (CuPy's bool storage).
#pragma once

// Row b takes token t (nothing if the row is done).
__device__ __forceinline__ void record_token(int b, long long t, long long* out, long long* last, long long* pos,
                                             long long* count, long long* stopped_by, bool* done, bool* seen,
                                             const bool* stop, const long long* limit, int vocab, int width) {
    if (done[b]) return;
    const size_t at = (size_t)b * vocab + t;
    if (stop[at]) {
        stopped_by[b] = t;
        done[b] = true;
        return;
    }
    out[(size_t)b * width + count[b]] = t;
    seen[at] = true;
    last[b] = t;
    pos[b] += 1;
    done[b] = ++count[b] >= limit[b];
}
