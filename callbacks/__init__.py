"""Optional Lightning callbacks for envace runs (logging only; training never depends on them)."""
