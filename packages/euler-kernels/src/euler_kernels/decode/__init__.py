"""A decode step's token bookkeeping: decode_record.py (each row's picked token emitted, or the row ended),
decode_draft.py (a speculative step's drafts from the drafting heads' logits) and decode_accept.py (the
drafts head 0 agrees with, accepted and recorded), each with its launcher X_cuda.py and kernels X.cu;
decode_record.cuh holds the one-row rule that decode_record.cu and decode_accept.cu share."""
