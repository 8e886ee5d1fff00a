"""The probe workers' lives: groups, the zygote handle, spawn, adoption, supervision, restarts."""
