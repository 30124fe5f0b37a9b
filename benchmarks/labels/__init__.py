"""Labels and review: label decoding, confidence, cascades, reasoning budgets, calibration, Label Studio."""
