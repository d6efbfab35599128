"""Lesson 1's wrong answers: each a few edits of the solution cell l01_engine_core_step, with the misconception it models.

Instructor side only (`python -m autograder release` leaves this file out). Every mutant must score less
than the solution (tests/test_lesson01_grading.py builds each wrong notebook from the release and grades it).
"""
from autograder.mutation import Mutant

CELL = "l01_engine_core_step"

MUTANTS = {
    "aborts_skipped": Mutant(CELL, (
        ('    process_aborts()',
         '    None'),
    ), 'Never drains the abort queue (the aborts blank filled with a no-op).',
       fails={"l01_main_path", "l01_real_engine"},
       hint="取消队列（aborts）这一步真的做了事吗？检查它在一步里是否被执行。"),
    "no_early_return": Mutant(CELL, (
        (('    if not has_requests:\n'
          '        return {}, False, trace\n'
          '\n'
          '    # TODO：保持 schedule → async execute/grammar → wait → aborts → update。'),
         ''),
    ), 'Runs a step even when there are no requests (the has_requests guard forgotten).',
       fails={"l01_boundary"},
       hint="没有请求时，这一步应该做什么、返回什么？"),
    "outputs_not_from_update": Mutant(CELL, (
        ('    outputs = update(plan, model_output)',
         ('    update(plan, model_output)\n'
          '    outputs = {"r0": model_output["tokens"]}')),
    ), 'Calls update() but builds the outputs itself from the raw model output.',
       fails={"l01_main_path", "l01_real_engine"},
       hint="这一步返回的 outputs 是从哪里来的？回顾 update 的职责。"),
    "schedule_twice": Mutant(CELL, (
        ('    future = execute_async(plan)',
         '    future = execute_async(schedule())'),
    ), 'Calls schedule() a second time to get the plan it passes to the executor.',
       fails={"l01_main_path", "l01_real_engine"},
       hint="传给执行器的 plan 与 schedule() 返回的是同一个对象吗？数一数调用次数。"),
    "scheduled_tokens_boundary": Mutant(CELL, (
        ('    return outputs, plan["scheduled_tokens"] > 0, trace',
         '    return outputs, plan["scheduled_tokens"] >= 0, trace'),
    ), 'Reports ran=True for a step that scheduled zero tokens (>= instead of >).',
       fails={"l01_boundary"},
       hint="调度了 0 个 token 的一步，算不算“运行了”？检查边界比较。"),
    "update_before_aborts": Mutant(CELL, (
        (('    process_aborts()\n'
          '    trace.append("aborts")\n'
          '    outputs = update(plan, model_output)'),
         ('    outputs = update(plan, model_output)\n'
          '    trace.append("aborts")\n'
          '    process_aborts()')),
    ), 'Applies the model output before draining the abort queue (trace lines kept in place).',
       fails={"l01_main_path", "l01_real_engine"},
       hint="更新输出与处理取消，谁应先发生？想想刚被取消的请求。"),
    "wait_before_grammar": Mutant(CELL, (
        ('    grammar = get_grammar(plan)',
         ('    model_output = future()\n'
          '    grammar = get_grammar(plan)')),
        ('    model_output = future()',
         ''),
    ), 'Blocks on the future before preparing the grammar, so nothing overlaps the forward pass.',
       fails={"l01_main_path", "l01_real_engine"},
       hint="等待 future 的时机是否让 grammar 与 forward 失去了重叠？"),
    "aborts_before_wait": Mutant(CELL, (
        (('    model_output = future()\n'
          '    trace.append("wait")\n'
          '    process_aborts()'),
         ('    process_aborts()\n'
          '    trace.append("wait")\n'
          '    model_output = future()')),
    ), 'Drains the abort queue before waiting on the forward (an abort that lands during the wait is missed).',
       fails={"l01_main_path", "l01_real_engine"},
       hint="想一想：在 forward 运行期间到达的取消请求，会在哪一步被处理？"),
    "grammar_before_execute": Mutant(CELL, (
        (('    future = execute_async(plan)\n'
          '    trace.append("execute")\n'
          '    grammar = get_grammar(plan)'),
         ('    grammar = get_grammar(plan)\n'
          '    trace.append("execute")\n'
          '    future = execute_async(plan)')),
    ), 'Builds the grammar bitmask before launching the forward: the CPU work no longer overlaps it.',
       fails={"l01_main_path", "l01_real_engine"},
       hint="grammar 的 CPU 工作和 forward 是否还在重叠？回顾各步骤的先后。"),
    "waits_twice": Mutant(CELL, (
        ('    outputs = update(plan, model_output)', '    outputs = update(plan, future())'),
    ), 'Calls the future again for update instead of passing the model_output it already returned.',
       fails={"l01_main_path", "l01_real_engine"},
       hint="future 被调用了几次？update 用的是哪份模型输出？"),
    "grammar_from_future": Mutant(CELL, (
        ('    grammar = get_grammar(plan)', '    grammar = get_grammar(future)'),
    ), 'Hands the grammar step the future instead of the plan it must build the bitmask for.',
       fails={"l01_main_path"},
       hint="grammar 的 bitmask 是为哪一份调度计划准备的？它收到的参数对吗？"),
    "update_with_future": Mutant(CELL, (
        ('    outputs = update(plan, model_output)', '    outputs = update(plan, future)'),
    ), 'Passes update the future itself, not the model output the wait returned.',
       fails={"l01_main_path"},
       hint="update 需要的是模型输出本身，还是还没取结果的 future？"),
}
