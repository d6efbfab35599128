# ruff: noqa: F841, B018  (a deliberately wrong answer: the lint findings are the point)
"""Wrong: blocks on the future before preparing the grammar, so nothing overlaps the forward pass."""


def engine_core_step(has_requests, schedule, execute_async,
                     get_grammar, process_aborts, update):
    trace = []
    if not has_requests:
        return {}, False, trace

    plan = schedule()
    trace.append("schedule")
    future = execute_async(plan)
    trace.append("execute")
    model_output = future()
    grammar = get_grammar(plan)
    trace.append("grammar")
    trace.append("wait")
    process_aborts()
    trace.append("aborts")
    outputs = update(plan, model_output)
    trace.append("update")
    return outputs, plan["scheduled_tokens"] > 0, trace
