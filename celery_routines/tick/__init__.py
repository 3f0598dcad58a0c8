"""One beat tick: read, decide (pure), write, then send."""
