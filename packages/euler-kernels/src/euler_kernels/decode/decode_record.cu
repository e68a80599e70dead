// The bookkeeping after a decode step picked each row's next token, one thread per row (see
// decode_record.py for the rule, decode_record.cuh for its code): a row still going emits the token
// unless it is one of its stop tokens; a stop token or the row's limit ends it.
#include "decode_record.cuh"

extern "C" __global__ void decode_record(long long* out, long long* last, long long* pos, long long* count,
                                         long long* stopped_by, bool* done, bool* seen, const long long* token,
                                         const bool* stop, const long long* limit, int rows, int vocab,
                                         int width) {
    const int b = blockIdx.x * blockDim.x + threadIdx.x;
    if (b >= rows) return;
    record_token(b, token[b], out, last, pos, count, stopped_by, done, seen, stop, limit, vocab, width);
}
