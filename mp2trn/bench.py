"""`mp2trn bench` (being written; see issue 2)."""
