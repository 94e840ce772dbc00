"""Past one machine: the replay, scoring and generation stages spread over a Ray cluster, one unit of work per task.

Takes what the local stages take (trajectories, a release and predictions, prompts) plus a Ray address (none: a local
Ray on this machine's cores); gives the same files the local stages write, in the same order.
"""
