// A speculative step's bookkeeping, one thread per row (ops/decode_accept.py): the drafts head 0 agrees
// with accepted, their tokens recorded in order by decode_record's rule (decode_record.cuh).
#include "decode_record.cuh"

// g (B, M + 1) head 0's tokens after each fed one, drafts (B, M): row b accepts its drafts up to the first
// that head 0 disagrees with (a of them), records g[b, 0..a] in order, counts its M drafts and the accepted
// ones that were emitted, and writes a to chosen[b] (the fed position whose hidden state drafts next).
extern "C" __global__ void decode_accept(long long* chosen, long long* drafted, long long* accepted,
                                         long long* out, long long* last, long long* pos, long long* count,
                                         long long* stopped_by, bool* done, bool* seen, const long long* g,
                                         const long long* drafts, const bool* stop, const long long* limit,
                                         int rows, int m, int vocab, int width) {
    const int b = blockIdx.x * blockDim.x + threadIdx.x;
    if (b >= rows) return;
    const long long* gb = g + (size_t)b * (m + 1);
    int a = 0;
    while (a < m && gb[a] == drafts[(size_t)b * m + a]) a++;
    chosen[b] = a;
    if (done[b]) return;
    const long long before = count[b];
    for (int i = 0; i <= a; i++)
        record_token(b, gb[i], out, last, pos, count, stopped_by, done, seen, stop, limit, vocab, width);
    drafted[b] += m;
    accepted[b] += max(count[b] - before - 1, 0LL);
}
