"""The development routes (vLLM: entrypoints/serve/dev/{cache,rlhf,rpc,server_info,sleep}/api_router.py), served
only with VLLM_SERVER_DEV_MODE=1 (vLLM reads the same variable, envs.py): they let anyone reset caches, pause,
abort, sleep and run worker methods, so never on a production server.

    POST /reset_prefix_cache[?reset_running_requests=&reset_external=]  {"success": bool}
    POST /reset_mm_cache, /reset_encoder_cache                             200, empty (minivllm has neither cache)
    POST /pause[?mode=abort|wait|keep&clear_cache=]  /resume  GET /is_paused  POST /abort_requests {"request_ids"}
    POST /sleep[?level=&mode=]  /wake_up[?tags=...]  GET /is_sleeping
    POST /collective_rpc {"method", "args", "kwargs", "timeout"}   GET /get_world_size  GET /server_info
    POST /update_weight_version {"new_version"}  GET /weight_info  and the weight-transfer routes, which fail
    as vLLM's do when no weight transfer engine is configured (minivllm has none).

Every route goes through AsyncLLM, which asks the EngineCore process by a utility call (the pause and sleep
states live in the core's scheduler and executor, as in vLLM). Answers, errors included, are vLLM's.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import os
import platform
import sys
from http import HTTPStatus
from typing import Annotated, Literal

from fastapi import APIRouter, Body, FastAPI, Query, Request
from fastapi.responses import JSONResponse, Response

from minivllm import envs

logger = logging.getLogger("minivllm.api_server")
router = APIRouter()
BAD_REQUEST = HTTPStatus.BAD_REQUEST.phrase


def dev_mode_enabled() -> bool:
    """VLLM_SERVER_DEV_MODE as vLLM's envs read it: an integer, 0 (the default) off."""
    return envs.VLLM_SERVER_DEV_MODE


def attach_router(app: FastAPI) -> None:
    logger.warning("SECURITY WARNING: Development endpoints are enabled! This should NOT be used in production!")
    app.include_router(router)


def engine(request: Request):
    return request.app.state.serving.engine


def _error(status: int, message: str, err_type: str):
    from minivllm.entrypoints.openai.api_server import error_response  # the server imports this module
    return error_response(status, message, err_type)


async def _json_body(request: Request, message: str = "Invalid JSON format"):
    """The body as JSON, or (None, vLLM's 400 for a body that is not JSON)."""
    try:
        return await request.json(), None
    except ValueError as e:
        return None, _error(400, message.format(e=e), BAD_REQUEST)


async def _engine_call(coro, what: str):
    """A core-side failure (the utility call raised) is vLLM's 500: "Call to <what> method failed: ..."."""
    try:
        return await coro, None
    except RuntimeError as e:
        return None, _error(500, f"Call to {what} method failed: {e}", "InternalServerError")


# ---------------------------------------------------------------------------- caches (dev/cache)
@router.post("/reset_prefix_cache")
async def reset_prefix_cache(raw_request: Request, reset_running_requests: bool = Query(default=False),
                             reset_external: bool = Query(default=False)):
    """{"success": false} while requests hold blocks, unless reset_running_requests preempts them (they
    recompute). minivllm has no external (connector) cache: reset_external has nothing more to reset."""
    ok = await engine(raw_request).reset_prefix_cache(reset_running_requests, reset_external)
    return JSONResponse({"success": bool(ok)})


@router.post("/reset_mm_cache")
async def reset_mm_cache(raw_request: Request):
    await engine(raw_request).reset_mm_cache()
    return Response(status_code=200)


@router.post("/reset_encoder_cache")
async def reset_encoder_cache(raw_request: Request):
    await engine(raw_request).reset_encoder_cache()
    return Response(status_code=200)


# ---------------------------------------------------------------------------- pause and abort (dev/rlhf)
@router.post("/pause")
async def pause_generation(raw_request: Request, mode: Annotated[Literal["abort", "wait", "keep"], Query()] = "abort",
                           wait_for_inflight_requests: bool = Query(False),
                           clear_cache: Annotated[bool, Query()] = True):
    """Answers once the pause is complete: at once for "abort" and "keep", after the running requests
    finished for "wait" (wait_for_inflight_requests=true is vLLM's deprecated spelling of it)."""
    try:
        await engine(raw_request).pause_generation(mode=mode, clear_cache=clear_cache,
                                                   wait_for_inflight_requests=wait_for_inflight_requests)
    except ValueError as err:
        return JSONResponse({"error": str(err)}, 400)
    except Exception as err:
        logger.exception("Failed to pause generation")
        return JSONResponse({"error": f"Failed to pause generation: {err}"}, 500)
    return JSONResponse({"status": "paused"})


@router.post("/resume")
async def resume_generation(raw_request: Request):
    try:
        await engine(raw_request).resume_generation()
    except Exception as err:
        logger.exception("Failed to resume generation")
        return JSONResponse({"error": f"Failed to resume generation: {err}"}, 500)
    return JSONResponse({"status": "resumed"})


@router.post("/abort_requests")
async def abort_requests(raw_request: Request):
    """Abort the listed request ids (a client's ids: n > 1 children included), or every request in flight when
    there are none; "aborted" counts what was asked for, as vLLM's does (a string id: its length)."""
    body, error = await _json_body(raw_request)
    if error is not None:
        return error
    request_ids = body.get("request_ids")  # a body that is no object: the 500 vLLM answers
    eng = engine(raw_request)
    try:
        if request_ids:
            eng.abort_external([request_ids] if isinstance(request_ids, str) else list(request_ids))
        else:
            request_ids = eng.abort_all_ids()
            await eng.abort(request_ids)
    except Exception as err:
        logger.exception("Failed to abort requests")
        return JSONResponse({"error": f"Failed to abort requests: {err}"}, 500)
    return JSONResponse({"status": "aborted", "aborted": len(request_ids)})


@router.get("/is_paused")
async def is_paused(raw_request: Request):
    try:
        paused = await engine(raw_request).is_paused()
    except Exception as err:
        logger.exception("Failed to fetch pause status")
        return JSONResponse({"error": f"Failed to fetch pause status: {err}"}, 500)
    return JSONResponse({"is_paused": paused})


# ---------------------------------------------------------------------------- weights (dev/rlhf)
async def _weight_transfer_with(raw_request: Request, field: str, what: str):
    """vLLM's routes that read one field of a JSON body first: a missing body or field is a 400."""
    body, error = await _json_body(raw_request)
    if error is not None:
        return error
    if body.get(field) is None:
        return _error(400, f"Missing '{field}' in request body", BAD_REQUEST)
    return await _weight_transfer(raw_request, what)


@router.post("/init_weight_transfer_engine")
async def init_weight_transfer_engine(raw_request: Request):
    return await _weight_transfer_with(raw_request, "init_info", "init_weight_transfer_engine")


@router.post("/start_weight_update")
async def start_weight_update(raw_request: Request):
    return await _weight_transfer(raw_request, "start_weight_update")


@router.post("/start_draft_weight_update")
async def start_draft_weight_update(raw_request: Request):
    return await _weight_transfer(raw_request, "start_draft_weight_update")


@router.post("/update_weights")
async def update_weights(raw_request: Request):
    return await _weight_transfer_with(raw_request, "update_info", "update_weights")


@router.post("/finish_weight_update")
async def finish_weight_update(raw_request: Request, weight_version: Annotated[str | None, Body(embed=True)] = None):
    """vLLM sets weight_version only after the weight transfer engine finished the update: never here."""
    return await _weight_transfer(raw_request, "finish_weight_update")


async def _weight_transfer(raw_request: Request, what: str):
    _, error = await _engine_call(engine(raw_request).weight_transfer(what), "collective_rpc")
    return error


@router.post("/update_weight_version")
async def update_weight_version(raw_request: Request, new_version: Annotated[str, Body(embed=True)]):
    await engine(raw_request).update_weight_version(new_version)
    return JSONResponse({"success": True, "new_version": new_version})


@router.get("/weight_info")
async def weight_info(raw_request: Request):
    return JSONResponse({"weight_version": await engine(raw_request).get_weight_version()})


@router.get("/get_world_size")
async def get_world_size(raw_request: Request, include_dp: bool = Query(True)):
    """TP x PP (x DP with include_dp): minivllm has tensor parallelism only, so both are its world size."""
    return JSONResponse({"world_size": engine(raw_request).vllm_config.parallel_config.world_size})


# ---------------------------------------------------------------------------- worker RPC (dev/rpc)
@router.post("/collective_rpc")
async def collective_rpc(raw_request: Request):
    """Run Worker.<method>(*args, **kwargs) on every worker; each answer that is not None, a dict or a list
    comes back as its str()."""
    body, error = await _json_body(raw_request, "JSON decode error: {e}")
    if error is not None:
        return error
    method = body.get("method")
    if method is None:
        return _error(400, "Missing 'method' in request body", BAD_REQUEST)
    args, kwargs = body.get("args", []), body.get("kwargs", {})
    results, error = await _engine_call(engine(raw_request).collective_rpc(
        method, timeout=body.get("timeout"), args=tuple(args), kwargs=kwargs), "collective_rpc")
    if error is not None:
        return error
    if results is None:
        return Response(status_code=200)
    return JSONResponse({"results": [r if r is None or isinstance(r, (dict, list)) else str(r) for r in results]})


# ---------------------------------------------------------------------------- server info (dev/server_info)
@router.get("/server_info")
async def show_server_info(raw_request: Request,
                           config_format: Annotated[Literal["text", "json"], Query()] = "text"):
    """minivllm's own config, environment variables and system: vLLM's keys, not its values (which name
    vLLM's own config classes, its hundreds of VLLM_* settings and its build)."""
    config = engine(raw_request).vllm_config
    info = {"vllm_config": str(config) if config_format == "text" else _jsonable(dataclasses.asdict(config)),
            "vllm_env": {k: v for k, v in sorted(os.environ.items())
                         if k.startswith(("VLLM_", "MINIVLLM_")) and "KEY" not in k},
            "system_env": _system_env()}
    return JSONResponse(info)


def _jsonable(obj):
    """JSON as vLLM's dump_python(mode="json", fallback=str) makes it: whatever JSON lacks, as its str()."""
    return json.loads(json.dumps(obj, default=str))


def _system_env() -> dict:
    import torch

    import minivllm
    return {"torch_version": torch.__version__, "python_version": sys.version.split()[0],
            "python_platform": platform.platform(), "is_cuda_available": torch.cuda.is_available(),
            "cpu_count": os.cpu_count(), "minivllm_version": minivllm.__version__}


# ---------------------------------------------------------------------------- sleep (dev/sleep)
@router.post("/sleep")
async def sleep(raw_request: Request):
    """Pause (mode, as /pause) and, from level 1, free the KV cache (Worker.sleep). The query values are
    read as vLLM reads them: a level that is no integer is a 400 (ValueError), a bad mode the core's 500."""
    level = int(raw_request.query_params.get("level", "1"))
    mode = raw_request.query_params.get("mode", "abort")
    _, error = await _engine_call(engine(raw_request).sleep(level, mode), "sleep")
    return error or Response(status_code=200)


@router.post("/wake_up")
async def wake_up(raw_request: Request):
    """Wake the given tags ("weights", "kv_cache", "scheduling"; none: everything); scheduling resumes once
    nothing sleeps."""
    tags = raw_request.query_params.getlist("tags") or None
    _, error = await _engine_call(engine(raw_request).wake_up(tags), "wake_up")
    return error or Response(status_code=200)


@router.get("/is_sleeping")
async def is_sleeping(raw_request: Request):
    return JSONResponse({"is_sleeping": await engine(raw_request).is_sleeping()})
