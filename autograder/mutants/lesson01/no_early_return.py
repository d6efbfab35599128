# ruff: noqa: F841, B018  (a deliberately wrong answer: the lint findings are the point)
"""Wrong: runs a step even when there are no requests (the has_requests guard forgotten)."""


def engine_core_step(has_requests, schedule, execute_async,
                     get_grammar, process_aborts, update):
    trace = []
    plan = schedule()
    trace.append("schedule")
    future = execute_async(plan)
    trace.append("execute")
    grammar = get_grammar(plan)
    trace.append("grammar")
    model_output = future()
    trace.append("wait")
    process_aborts()
    trace.append("aborts")
    outputs = update(plan, model_output)
    trace.append("update")
    return outputs, plan["scheduled_tokens"] > 0, trace
