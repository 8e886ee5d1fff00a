"""The probe workers, as the daemon sees them.

supervisor.py (groups, registrations, handover) -> sandbox_group.py (a group's sandboxes in its worker) -> life.py (the
worker's lives: spawn or adoption, serving, death, restart) -> process.py and connection.py; the zygotes are
zygote_pool.py's, each reached through zygote_handle.py and its channel; grouping.py and adoption.py are the pure
rules, settings.py the one frozen settings object, records.py what is kept per sandbox.
"""
