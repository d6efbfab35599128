"""Wrong: caps running requests by the threshold but lets a new prompt take the whole budget."""


def schedule_step(running, waiting, token_budget, threshold, max_num_seqs,
                  num_new_tokens, allocate, preempt):
    scheduled = {}  # request_id -> tokens computed this step
    preempted = []  # requests preempted (by recompute) this step

    # 1. RUNNING first, oldest first.
    i = 0
    while i < len(running) and token_budget > 0:
        req = running[i]
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

    # 2. Then WAITING, first come first served.
    admit = not preempted
    while admit and waiting and token_budget > 0 and len(running) < max_num_seqs:
        req = waiting[0]
        n = min(num_new_tokens(req), token_budget)
        if not allocate(req, n):
            break
        running.append(waiting.popleft())
        scheduled[req.request_id] = n
        token_budget -= n
    return scheduled, preempted
