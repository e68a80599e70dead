"""`euler-train eval` tasks: bits per byte, HellaSwag and ARC multiple choice, and the chat evaluation.

One module per task (bpb, multiple_choice, chat) over one batched scorer (scoring.score_rows); the
command line is in args.py, the command in command.py.
"""
