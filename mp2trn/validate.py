"""`mp2trn validate` and `mp2trn interaction` (being written; see issue 5)."""
