"""The engine alone: its start, compile cache, dtype and precision, memory reserve, profiles, roofline."""
