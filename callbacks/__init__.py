"""Optional Lightning callbacks for envace runs.

Decoded episodes in TensorBoard, every evaluated episode as JSON Lines, benchmark evaluation, rehearsal-budget
ablations, stopping at a plateau.
"""
