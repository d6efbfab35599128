"""Lesson 2's wrong answers: each a few edits of the solution cell l02_schedule_step, with the misconception it models.

Instructor side only (`python -m autograder release` leaves this file out). Every mutant must score less
than the solution (tests/test_lesson02_grading.py builds each wrong notebook from the release and grades it).
"""
from autograder.mutation import Mutant

CELL = "l02_schedule_step"

MUTANTS = {
    "admission_after_preemption": Mutant(CELL, (
        ('    admit = not preempted',
         ('    # 2. Then WAITING, first come first served.\n'
          '    admit = True')),
    ), 'Admits waiting requests even in a step that had to preempt.',
       fails={"l02_boundary", "l02_real_engine"},
       hint="一步里已经发生了抢占，还应该接纳等待队列中的请求吗？"),
    "budget_not_decremented": Mutant(CELL, (
        (('        token_budget -= n\n'
          '        i += 1'),
         ('        token_budget -= 0\n'
          '        i += 1')),
        (('        token_budget -= n\n'
          '    return scheduled, preempted'),
         ('        token_budget -= 0\n'
          '    return scheduled, preempted')),
    ), 'Never takes the scheduled tokens off the budget.',
       fails={"l02_boundary", "l02_main_path", "l02_real_engine"},
       hint="每调度一个请求之后，token 预算有没有随之变化？"),
    "preempt_oldest": Mutant(CELL, (
        ('            victim = running.pop()',
         '            victim = running.pop(0)'),
    ), 'Preempts the oldest running request (running[0]) instead of the newest.',
       fails={"l02_boundary", "l02_real_engine"},
       hint="抢占时选中的是哪个运行中的请求？回顾优先级与队列顺序。"),
    "skip_instead_of_preempt": Mutant(CELL, (
        (('        ok = allocate(req, n)\n'
          '        while not ok:\n'
          '            victim = running.pop()\n'
          '            preempt(victim)\n'
          '            preempted.append(victim)\n'
          '            if victim is req:\n'
          '                break\n'
          '            ok = allocate(req, n)\n'
          '        if not ok:\n'
          '            break'),
         ('        if not allocate(req, n):\n'
          '            i += 1\n'
          '            continue')),
    ), 'When allocate fails, skips the request and moves on instead of preempting.',
       fails={"l02_boundary", "l02_real_engine"},
       hint="分配 KV 块失败时，调度器应如何腾出空间，而不是跳过？"),
    "threshold_ignored": Mutant(CELL, (
        (('        n = min(num_new_tokens(req), threshold, token_budget)\n'
          '        ok = allocate(req, n)'),
         ('        n = min(num_new_tokens(req), token_budget)\n'
          '        ok = allocate(req, n)')),
        (('        n = min(num_new_tokens(req), threshold, token_budget)\n'
          '        if not allocate(req, n):'),
         ('        n = min(num_new_tokens(req), token_budget)\n'
          '        if not allocate(req, n):')),
    ), 'Ignores long_prefill_token_threshold: each request gets min(remaining, budget left).',
       fails={"l02_boundary", "l02_main_path", "l02_real_engine"},
       hint="每个请求分到的 token 数还受哪个上限约束？"),
    "waiting_before_running": Mutant(CELL, (
        ('    #       allocate 失败就抢占优先级最低的 running 请求；本步抢占过就不再接纳新请求。',
         ('    admit = True\n'
          '    while admit and waiting and token_budget > 0 and len(running) < max_num_seqs:\n'
          '        req = waiting[0]\n'
          '        n = min(num_new_tokens(req), threshold, token_budget)\n'
          '        if not allocate(req, n):\n'
          '            break\n'
          '        running.append(waiting.popleft())\n'
          '        scheduled[req.request_id] = n\n'
          '        token_budget -= n\n'
          '\n'
          '    #       allocate 失败就抢占优先级最低的 running 请求；本步抢占过就不再接纳新请求。')),
        ('    while i < len(running) and token_budget > 0:',
         ('    admitted = set(scheduled)\n'
          '    while i < len(running) and token_budget > 0:')),
        (('        n = min(num_new_tokens(req), threshold, token_budget)\n'
          '        ok = allocate(req, n)'),
         ('        if req.request_id in admitted:\n'
          '            i += 1\n'
          '            continue\n'
          '        n = min(num_new_tokens(req), threshold, token_budget)\n'
          '        ok = allocate(req, n)')),
        (('    admit = not preempted\n'
          '    while admit and waiting and token_budget > 0 and len(running) < max_num_seqs:\n'
          '        req = waiting[0]\n'
          '        n = min(num_new_tokens(req), threshold, token_budget)\n'
          '        if not allocate(req, n):\n'
          '            break\n'
          '        running.append(waiting.popleft())\n'
          '        scheduled[req.request_id] = n\n'
          '        token_budget -= n'),
         ''),
    ), 'Admits waiting requests before serving the running ones (decodes can starve).',
       fails={"l02_boundary", "l02_main_path", "l02_real_engine"},
       hint="运行中的请求与等待中的请求，谁先被服务？想想 decode 会不会饿死。"),
    "waiting_ignores_threshold": Mutant(CELL, (
        (('        n = min(num_new_tokens(req), threshold, token_budget)\n'
          '        if not allocate(req, n):'),
         ('        n = min(num_new_tokens(req), token_budget)\n'
          '        if not allocate(req, n):')),
    ), 'Caps running requests by the threshold but lets a new prompt take the whole budget.',
       fails={"l02_boundary", "l02_main_path", "l02_real_engine"},
       hint="长 prefill 的阈值对新进入的 prompt 也适用吗？"),
    "victim_not_removed": Mutant(CELL, (
        ('            victim = running.pop()',
         '            victim = running[-1]'),
    ), 'Reads the preemption victim but leaves it in running (it is preempted again and again).',
       fails={"l02_boundary", "l02_real_engine"},
       hint="被抢占的请求之后还留在 running 里吗？"),
    "running_ignores_threshold": Mutant(CELL, (
        (('        n = min(num_new_tokens(req), threshold, token_budget)\n'
          '        ok = allocate(req, n)'),
         ('        n = min(num_new_tokens(req), token_budget)\n'
          '        ok = allocate(req, n)')),
    ), 'Caps only new prompts by long_prefill_token_threshold: a running chunked prefill takes the whole budget.',
       fails={"l02_main_path", "l02_real_engine"},
       hint="长 prefill 的阈值（long_prefill_token_threshold）对运行中的分块 prefill 也适用吗？"),
    "running_ignores_budget": Mutant(CELL, (
        (('        n = min(num_new_tokens(req), threshold, token_budget)\n'
          '        ok = allocate(req, n)'),
         ('        n = min(num_new_tokens(req), threshold)\n'
          '        ok = allocate(req, n)')),
    ), 'Forgets the budget left for running requests (a decode costs nothing, a chunk is capped by threshold only).',
       fails={"l02_main_path"},
       hint="运行中的请求分到的 token 是否受剩余预算约束？"),
    "decode_costs_one": Mutant(CELL, (
        (('        token_budget -= n\n'
          '        i += 1'),
         ('        token_budget -= 1\n'
          '        i += 1')),
    ), 'Charges each running request one token, as if every running request were decoding.',
       fails={"l02_main_path", "l02_real_engine"},
       hint="一个正在运行的请求这一步需要多少 token？它不一定在 decode。"),
    "waiting_charged_whole_prompt": Mutant(CELL, (
        (('        token_budget -= n\n'
          '    return scheduled, preempted'),
         ('        token_budget -= num_new_tokens(req)\n'
          '    return scheduled, preempted')),
    ), 'Takes a new request\'s whole remaining prompt off the budget, not the chunk it was given.',
       fails={"l02_main_path", "l02_real_engine"},
       hint="新请求从预算里扣掉的，是整段 prompt 还是它这一步实际分到的量？"),
    "victim_is_current": Mutant(CELL, (
        ('            victim = running.pop()', '            victim = running.pop(i)'),
    ), 'Preempts the request whose allocation failed instead of the lowest-priority (last) running one.',
       fails={"l02_boundary", "l02_real_engine"},
       hint="分配失败时被抢占的应该是谁？回顾运行队列中的优先级。"),
    "waiting_skips_head": Mutant(CELL, (
        (('    while admit and waiting and token_budget > 0 and len(running) < max_num_seqs:\n'
          '        req = waiting[0]'),
         ('    for req in list(waiting):\n'
          '        if not (admit and token_budget > 0 and len(running) < max_num_seqs):\n'
          '            break')),
        (('        if not allocate(req, n):\n'
          '            break\n'
          '        running.append(waiting.popleft())'),
         ('        if not allocate(req, n):\n'
          '            continue\n'
          '        waiting.remove(req)\n'
          '        running.append(req)')),
    ), 'When the waiting head does not fit, admits the requests behind it (no FCFS head-of-line stop).',
       fails={"l02_main_path", "l02_boundary", "l02_real_engine"},
       hint="等待队列的队首放不下时，后面的请求可以越过它先进来吗？"),
    "max_num_seqs_ignored": Mutant(CELL, (
        ('    while admit and waiting and token_budget > 0 and len(running) < max_num_seqs:',
         '    while admit and waiting and token_budget > 0:'),
    ), 'Admits new requests without looking at max_num_seqs.',
       fails={"l02_main_path"},
       hint="running 里最多能有多少个请求？接纳时检查了吗？"),
    "max_num_seqs_off_by_one": Mutant(CELL, (
        ('    while admit and waiting and token_budget > 0 and len(running) < max_num_seqs:',
         '    while admit and waiting and token_budget > 0 and len(running) <= max_num_seqs:'),
    ), 'Lets running grow to max_num_seqs + 1.',
       fails={"l02_main_path"},
       hint="接纳之后 running 的长度最多是多少？检查边界。"),
    "waiting_ignores_budget_left": Mutant(CELL, (
        ('    while admit and waiting and token_budget > 0 and len(running) < max_num_seqs:',
         '    while admit and waiting and len(running) < max_num_seqs:'),
    ), 'Keeps admitting after the budget is used up (a new request with 0 tokens).',
       fails={"l02_main_path", "l02_real_engine"},
       hint="预算用完之后，还应该接纳新的请求吗？"),
    "running_ignores_budget_left": Mutant(CELL, (
        ('    while i < len(running) and token_budget > 0:',
         '    while i < len(running):'),
    ), 'Walks the whole running list after the budget is used up, giving the rest 0 tokens.',
       fails={"l02_main_path"},
       hint="预算用完之后，running 列表里剩下的请求本步还要处理吗？"),
    "no_retry_after_preempt": Mutant(CELL, (
        (('            ok = allocate(req, n)\n'
          '        if not ok:'),
         ('            break\n'
          '        if not ok:')),
    ), 'After preempting one victim, gives up on the request instead of retrying allocate (vLLM frees until it fits).',
       fails={"l02_boundary", "l02_real_engine"},
       hint="抢占一个请求腾出块之后，应该就此放弃，还是再为当前请求试一次 allocate？"),
}
