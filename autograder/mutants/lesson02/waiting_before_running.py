"""Wrong: admits waiting requests before serving the running ones (decodes can starve)."""


def schedule_step(running, waiting, token_budget, threshold, max_num_seqs,
                  num_new_tokens, allocate, preempt):
    scheduled = {}  # request_id -> tokens computed this step
    preempted = []  # requests preempted (by recompute) this step

    # WAITING first (wrong order), first come first served.
    admit = True
    while admit and waiting and token_budget > 0 and len(running) < max_num_seqs:
        req = waiting[0]
        n = min(num_new_tokens(req), threshold, token_budget)
        if not allocate(req, n):
            break
        running.append(waiting.popleft())
        scheduled[req.request_id] = n
        token_budget -= n

    # then RUNNING, skipping the requests just admitted.
    i = 0
    admitted = set(scheduled)
    while i < len(running) and token_budget > 0:
        req = running[i]
        if req.request_id in admitted:
            i += 1
            continue
        n = min(num_new_tokens(req), threshold, token_budget)
        ok = allocate(req, n)
        while not ok:
            victim = running.pop()
            preempt(victim)
            preempted.append(victim)
            if victim is req:
                break
            ok = allocate(req, n)
        if not ok:
            break
        scheduled[req.request_id] = n
        token_budget -= n
        i += 1

    return scheduled, preempted
