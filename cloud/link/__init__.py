"""Network links between device and cloud: named profiles and their delay model (``profiles``),
and a user-space TCP proxy that applies them to real bytes (``emulator``).

The fleet simulator (``edgespec.cloud.simulate``) uses the same profiles and delay model, so
"a 4g link" means the same thing to both.
"""
