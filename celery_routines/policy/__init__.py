"""Pure decisions: the routine model, catch-up, run outcomes, overlap, ceilings."""
