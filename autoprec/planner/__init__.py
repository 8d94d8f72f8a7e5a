"""The planner: candidates, calibration's measurements, the damage and cost models, the at-scale projection, the
solver and the plans they produce, one ``ModelPlanner`` per compiled model. It knows GEMMs as ``GemmSpec`` data,
never as fx nodes: graph passes (``autoprec.passes``) import it, not the other way. See docs/planner.md."""
