"""Lesson 4's wrong answers: each a few edits of the solution cell l04_lifecycle, with the misconception it models.

Instructor side only (`python -m autograder release` leaves this file out). Every mutant must score less
than the solution (tests/test_mutants.py builds each wrong notebook from the release and grades it).
"""
from autograder.mutation import Mutant

CELL = "l04_lifecycle"

MUTANTS = {
    "victim_keeps_blocks": Mutant(CELL, (
        ('    sched.kv_cache_manager.free(request)\n    request.status = RequestStatus.PREEMPTED',
         '    request.status = RequestStatus.PREEMPTED'),
    ), 'Preempts without returning the victim\'s KV blocks to the pool.',
       fails={"l04_preempt", "l04_real_engine"},
       hint="抢占之后，被抢占请求的 KV 块去了哪里？"),
    "computed_not_reset": Mutant(CELL, (
        ('    request.num_computed_tokens = 0\n', ''),
    ), 'Keeps num_computed_tokens: resumes as if the dropped KV were still there.',
       fails={"l04_preempt", "l04_real_engine"},
       hint="按重算抢占之后，被释放的 KV 对应的进度还算数吗？"),
    "victim_at_back": Mutant(CELL, (
        ('    sched.waiting.appendleft(request)', '    sched.waiting.append(request)'),
    ), 'Puts the victim at the back of the waiting queue: later arrivals overtake it.',
       fails={"l04_preempt"},
       hint="被抢占的请求回到等待队列的哪一端？后来的请求会不会插到它前面？"),
    "abort_left_in_running": Mutant(CELL, (
        ('            sched.running.remove(request)', '            pass'),
    ), 'An aborted running request stays in sched.running and is scheduled again.',
       fails={"l04_abort", "l04_real_engine"},
       hint="取消一个正在运行的请求后，它还在哪个队列里？"),
    "abort_left_in_waiting": Mutant(CELL, (
        ('            sched.waiting.remove(request)', '            pass'),
    ), 'An aborted waiting or preempted request stays in sched.waiting and is admitted later.',
       fails={"l04_abort", "l04_real_engine"},
       hint="取消一个等待中（或被抢占）的请求后，它还会被再次接纳吗？"),
    "aborted_still_emits": Mutant(CELL, (
        ('        del sched.requests[request_id]\n', ''),
    ), 'Leaves the aborted request in sched.requests: the step in flight still emits its token.',
       fails={"l04_abort", "l04_real_engine"},
       hint="被取消的请求还留在调度器的请求表里吗？正在进行的一步还会给它输出吗？"),
    "max_tokens_off_by_one": Mutant(CELL, (
        ('num_output_tokens >= request.max_tokens', 'num_output_tokens > request.max_tokens'),
    ), 'Stops one token after max_tokens.',
       fails={"l04_stop", "l04_real_engine"},
       hint="达到 max_tokens 时是否多生成了一个？检查比较的边界。"),
    "eos_under_ignore_eos": Mutant(CELL, (
        ('    is_eos = not params.ignore_eos and last == request.eos_token_id',
         '    is_eos = last == request.eos_token_id'),
    ), 'Stops at EOS even when ignore_eos is set.',
       fails={"l04_stop"},
       hint="设置了 ignore_eos 时，遇到 EOS 还应该停止吗？"),
    "min_tokens_ignored": Mutant(CELL, (
        ('    too_early = num_output_tokens < params.min_tokens',
         '    too_early = False'),
    ), 'Stops at EOS or a stop token before min_tokens outputs.',
       fails={"l04_stop"},
       hint="输出还不到 min_tokens 时，遇到 EOS 或停止词该怎么办？"),
    "status_argument_ignored": Mutant(CELL, (
        ('        request.status = finished_status', '        request.status = RequestStatus.FINISHED_ABORTED'),
    ), 'Writes FINISHED_ABORTED whatever status the caller passes (the scheduler also finishes with FINISHED_ERROR).',
       fails={"l04_abort"},
       hint="调用者传入的结束状态有没有被用上？"),
    "abort_pops_waiting_head": Mutant(CELL, (
        ('            sched.waiting.remove(request)', '            sched.waiting.popleft()'),
    ), 'Removes the head of waiting instead of the aborted request (right only when it is the head).',
       fails={"l04_abort"},
       hint="从 waiting 中移除的是被取消的那个请求吗？换个位置试试。"),
    "preempted_counted_as_running": Mutant(CELL, (
        ('        in_running = request.status == RequestStatus.RUNNING',
         '        in_running = request.status != RequestStatus.WAITING'),
    ), 'Looks for a PREEMPTED request in running (it waits in sched.waiting).',
       fails={"l04_abort", "l04_real_engine"},
       hint="被抢占的请求在哪个队列里等待？"),
    "recompute_from_prefix_hit": Mutant(CELL, (
        ('    request.num_computed_tokens = 0\n', '    request.num_computed_tokens = max(request.num_cached_tokens, 0)\n'),
    ), 'Resets progress to the admission-time prefix hit (0 only with prefix caching off): that KV was freed too.',
       fails={"l04_preempt"},
       hint="按重算抢占时，接纳时命中的前缀 KV 还在吗？"),
    "min_tokens_off_by_one": Mutant(CELL, (
        ('    too_early = num_output_tokens < params.min_tokens',
         '    too_early = num_output_tokens <= params.min_tokens'),
    ), 'Keeps going at the min_tokens-th output (a stop there is allowed).',
       fails={"l04_stop"},
       hint="恰好在第 min_tokens 个输出时允许停止吗？检查比较的边界。"),
    "min_tokens_counts_prompt": Mutant(CELL, (
        ('    too_early = num_output_tokens < params.min_tokens',
         '    too_early = request.num_tokens < params.min_tokens'),
    ), 'Counts the prompt toward min_tokens (it counts outputs only).',
       fails={"l04_stop"},
       hint="min_tokens 数的是哪些 token？"),
    "max_tokens_counts_prompt": Mutant(CELL, (
        ('request.max_tokens is not None and num_output_tokens >= request.max_tokens',
         'request.max_tokens is not None and request.num_tokens >= request.max_tokens'),
    ), 'Compares prompt + outputs with max_tokens (max_tokens counts outputs only).',
       fails={"l04_stop", "l04_real_engine"},
       hint="max_tokens 数的是哪些 token？"),
    "abort_pops_waiting_tail": Mutant(CELL, (
        ('            sched.waiting.remove(request)', '            sched.waiting.pop()'),
    ), 'Removes the tail of waiting instead of the aborted request (right only when it is the last).',
       fails={"l04_abort"},
       hint="从 waiting 中移除的是被取消的那个请求吗？换个位置试试。"),
    "max_tokens_exact_match": Mutant(CELL, (
        ('request.max_tokens is not None and num_output_tokens >= request.max_tokens',
         'request.max_tokens is not None and num_output_tokens == request.max_tokens'),
    ), 'Stops only when the output count equals max_tokens: several tokens in one step can jump past it.',
       fails={"l04_stop"},
       hint="一步里可能产生多个 token：只在“恰好相等”时停止够吗？"),
    "eos_anywhere_in_output": Mutant(CELL, (
        ('    is_eos = not params.ignore_eos and last == request.eos_token_id',
         '    is_eos = not params.ignore_eos and request.eos_token_id in request.output_token_ids'),
    ), 'Stops on any EOS among the outputs: an EOS suppressed before min_tokens stops the request later anyway.',
       fails={"l04_stop"},
       hint="min_tokens 之前出现过的 EOS，之后还算数吗？check_stop 只看哪个 token？"),
    "eos_anywhere_in_sequence": Mutant(CELL, (
        ('    is_eos = not params.ignore_eos and last == request.eos_token_id',
         '    is_eos = not params.ignore_eos and request.eos_token_id in request.all_token_ids'),
    ), 'Looks for EOS in prompt and outputs: a prompt holding EOS (a multi-turn chat) stops at once.',
       fails={"l04_stop"},
       hint="EOS 出现在 prompt 里（多轮对话）时，请求应该立刻停吗？check_stop 只看哪个 token？"),
    "min_tokens_only_just_before": Mutant(CELL, (
        ('    too_early = num_output_tokens < params.min_tokens',
         '    too_early = num_output_tokens == params.min_tokens - 1'),
    ), 'Holds back a stop only at the output just before min_tokens: an earlier EOS still stops the request.',
       fails={"l04_stop"},
       hint="min_tokens=3 时第 1 个输出就是 EOS，应该停吗？“不到 min_tokens”包括哪些输出？"),
    "stop_reason_not_set": Mutant(CELL, (
        ('        request.stop_reason = last\n', ''),
    ), 'Stops on a stop token id but leaves stop_reason unset (the client never learns which id stopped it).',
       fails={"l04_stop"},
       hint="因 stop token 停下时，请求上还要记下什么？客户端怎样知道是哪个 token 让它停下的？"),
}
