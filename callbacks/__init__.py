"""Optional Lightning callbacks for envace runs: decoded episodes in TensorBoard, stopping at a plateau."""
