"""`distdoctor lint`: latent deadlock hazards in the dumps of a run that did not hang.

Each hazard is one small module asking one question of the normalized traces (trace/model.py):
order.py (order_inversion), conditional.py (rank_conditional_collective), p2p.py (p2p_order),
creation.py (group_creation_order), streams.py (false_wait). analyze.py runs them; hazard.py is the result type
and its one adapter to diagnose's Finding; command.py the CLI.
"""
