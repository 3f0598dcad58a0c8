"""Pure schedule math: no I/O, no clock reads; every instant is passed in.

A schedule answers two questions about windows (the instants a routine fires):
``next_after(instant)`` and ``windows(after, until)`` for the interval
``(after, until]``. Instants going in and coming out are aware UTC datetimes.
"""
