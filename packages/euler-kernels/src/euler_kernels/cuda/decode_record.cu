// The bookkeeping after a decode step picked each row's next token, one thread per row (see
// ops/decode_record.py for the rule): a row still going emits the token unless it is one of its stop
// tokens; a stop token or the row's limit ends it. bools are bytes (CuPy's bool storage).
extern "C" __global__ void decode_record(long long* out, long long* last, long long* pos, long long* count,
                                         long long* stopped_by, bool* done, bool* seen, const long long* token,
                                         const bool* stop, const long long* limit, int rows, int vocab,
                                         int width) {
    const int b = blockIdx.x * blockDim.x + threadIdx.x;
    if (b >= rows || done[b]) return;
    const long long t = token[b];
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
