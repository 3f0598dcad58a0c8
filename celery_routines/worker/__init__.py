"""The worker side of a run: claim before the body, outcomes, spend()."""
