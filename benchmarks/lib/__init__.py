"""What other benchmark scripts import: the result file writer, the measurement switches, the samplers."""
