"""Watches: pollers that wait for a job to be healthy (or not), a control request's answer, a snapshot, or a
restore check's verdict.

A watch reads the job store, keeps in memory what it must remember between looks (when the batch id
last changed, since when the job has been healthy), and answers each ``poll(now)`` with None while the
outcome is undecided, else the terminal event: a JSON-able dict whose ``status`` is from the watch's
closed set. The Airflow triggers and sensors run these (in a thread, or in the worker); nothing here
imports Airflow. Time is a parameter, so the rules are tested without sleeping.

One module per watch, as the triggers have one per trigger: ``base`` (the ``Watch`` protocol and what the
watches share), ``job_health`` (observe, judge, remember, tell: ``health_observe``, ``health_judge``,
``health_memory``, ``health_messages``), ``control`` (a control request's answer), ``snapshot``, ``restore_check``
(a detached restore check's verdict), and ``events`` (watches with a cursor that announce a stream of events: each
new snapshot, each rise of a number above a threshold).
"""
