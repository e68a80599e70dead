"""One module per op; each holds its forward and backward side by side."""
