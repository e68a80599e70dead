// A speculative step's bookkeeping, one block per row (decode_accept.py): the drafts head 0 agrees
// with accepted along the draft tree, their tokens recorded in order by decode_record's rule
// (decode_record.cuh), and the accepted drafts' keys and values moved to the slots of their positions.
#include "decode_record.cuh"

#define MAX_FED 8  // draft_tree.MAX_FED

// Fed token c's parent: packed 4 bits a token (tree != 0), or c - 1 in a chain (tree == 0).
__device__ __forceinline__ int parent_of(unsigned long long tree, int c) {
    return tree ? (int)((tree >> (4 * c)) & 0xfull) : c - 1;
}

// g (B, T) head 0's tokens after each fed one, drafts (B, T - 1) the fed drafts: row b walks from the root
// (fed token 0) to the child whose draft equals head 0's token after the current one, while there is one;
// it records g at each fed token of that path (a stop token or the limit ends it), counts its T - 1 drafts
// and the accepted ones that were emitted, writes the path's last fed token to chosen[b] (its hidden state
// drafts next), and moves the keys and values of the path's i-th token from slot p + c to slot p + i
// (p = pos[b] before the step) in every layer of the caches (L, B, Hkv, S, D), whose slot rows (D values)
// are row_words 4-byte words each. Thread 0 walks and records; the block moves.
extern "C" __global__ void decode_accept(long long* chosen, long long* drafted, long long* accepted,
                                         long long* out, long long* last, long long* pos, long long* count,
                                         long long* stopped_by, bool* done, bool* seen, const long long* g,
                                         const long long* drafts, const bool* stop, const long long* limit,
                                         unsigned* k_cache, unsigned* v_cache, int T, int vocab, int width,
                                         unsigned long long tree, int layers, int rows, int hkv, int S,
                                         int row_words) {
    const int b = blockIdx.x;
    __shared__ int path[MAX_FED];  // path[i]: the fed token at depth i, for the moves
    __shared__ int moves;
    __shared__ long long p0;
    if (threadIdx.x == 0) {
        const long long* gb = g + (size_t)b * T;
        const long long* db = drafts + (size_t)b * (T - 1);
        int node = 0, depth = 0;
        for (int c = 1; c < T; c++)  // children come after their parent: one pass finds the path
            if (parent_of(tree, c) == node && db[c - 1] == gb[node]) {
                node = c;
                if (++depth < MAX_FED) path[depth] = c;  // (a chain longer than that needs no path: c = i)
            }
        chosen[b] = node;
        moves = 0;
        p0 = pos[b];
        if (!done[b]) {
            const long long before = count[b];
            for (int i = 0; i <= depth; i++) {  // head 0's token after the path's i-th fed token
                const long long t = gb[i == 0 ? 0 : tree ? path[i] : i];
                record_token(b, t, out, last, pos, count, stopped_by, done, seen, stop, limit, vocab, width);
            }
            drafted[b] += T - 1;
            accepted[b] += max(count[b] - before - 1, 0LL);
            moves = tree && depth < MAX_FED ? depth : 0;  // a chain's path is in place
        }
    }
    __syncthreads();
    // move i after move i - 1 (its source slot may be a later move's target): slot p0 + path[i] -> p0 + i
    const int per_move = layers * hkv * row_words;  // 4-byte words of one slot over every layer and head
    for (int i = 1; i <= moves; i++) {
        if (path[i] == i) continue;  // the same for the whole block: the barrier below is reached by all
        for (int e = threadIdx.x; e < per_move; e += blockDim.x) {
            const int l = e / (hkv * row_words), h = (e / row_words) % hkv, w = e % row_words;
            const size_t head = (((size_t)l * rows + b) * hkv + h) * S;  // slot 0 of (layer, row, head)
            const size_t from = (head + p0 + path[i]) * row_words + w, to = (head + p0 + i) * row_words + w;
            k_cache[to] = k_cache[from];
            v_cache[to] = v_cache[from];
        }
        __syncthreads();
    }
}
