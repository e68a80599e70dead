// The bookkeeping after a decode step picked each row's next token, one thread per row (see
// ops/decode_record.py for the rule): a row still going emits the token unless it is one of its stop
// tokens; a stop token or the row's limit ends it. decode_accept (ops/decode_accept.py) applies the same
// rule to the accepted tokens of a speculative step in order. bools are bytes (CuPy's bool storage).

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

extern "C" __global__ void decode_record(long long* out, long long* last, long long* pos, long long* count,
                                         long long* stopped_by, bool* done, bool* seen, const long long* token,
                                         const bool* stop, const long long* limit, int rows, int vocab,
                                         int width) {
    const int b = blockIdx.x * blockDim.x + threadIdx.x;
    if (b >= rows) return;
    record_token(b, token[b], out, last, pos, count, stopped_by, done, seen, stop, limit, vocab, width);
}

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
