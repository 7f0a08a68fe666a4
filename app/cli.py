"""The `moechat` command. No subcommand opens the desktop app; engine imports happen lazily so
that the desktop app never loads torch in its own process."""

import argparse
import json
import sys
from dataclasses import asdict

from app import cli_arguments as arguments
from app.engine.spec.options import METHODS as SPEC_METHODS
from app.errors import UserError

CPU_THREADS_HELP = ("host cores that compute part of the experts a GPU misses while it fetches the rest (the CPU "
                    "expert tier: with --device cuda, every expert in RAM, one GPU; elsewhere it has no effect); "
                    "default 0: none")


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        return args.run(args)
    except UserError as error:
        print(f"moechat: error: {' '.join(str(error).split())}", file=sys.stderr)  # one line, whatever it quotes
        return 1
    except KeyboardInterrupt:
        print("moechat: interrupted", file=sys.stderr)
        return 130
    except MemoryError:
        print("moechat: error: out of memory: lower --gpu-budget / --ram-budget or the context", file=sys.stderr)
        return 1
    except OSError as error:  # a file or device the system refused: say which, in one line
        where = f" ({error.filename})" if error.filename else ""
        print(f"moechat: error: {error.strerror or error}{where}", file=sys.stderr)
        return 1


def _parser() -> argparse.ArgumentParser:
    parser = arguments.OneLineParser(prog="moechat", description="Chat with large Mixture-of-Experts models. "
                                     "`moechat` with no command opens the desktop app.")
    parser.set_defaults(run=_run_app)
    commands = parser.add_subparsers(title="commands")

    generate = commands.add_parser("generate", help="generate text from a prompt")
    generate.set_defaults(run=_run_generate)
    generate.add_argument("model", help="model folder (config.json + *.safetensors), or demo: the bundled demo model")
    source = generate.add_mutually_exclusive_group(required=True)
    source.add_argument("--prompt", type=arguments.text, help="prompt text")
    source.add_argument("--prompt-ids", type=arguments.token_ids,
                        help="raw token ids, e.g. 1,2,3 (no tokenizer, no template)")
    generate.add_argument("--chat", action="store_true", help="wrap --prompt as a user message in the chat template")
    generate.add_argument("--system", type=arguments.text, help="system message (with --chat)")
    generate.add_argument("--reasoning-effort", choices=("low", "medium", "high"), help="gpt-oss reasoning effort")
    generate.add_argument("--max-new-tokens", type=arguments.positive_int, default=256)
    generate.add_argument("--temperature", type=arguments.temperature, default=0.0, help="0 (greedy) or 0.001 … 2")
    generate.add_argument("--top-k", type=arguments.top_k, default=0, help="0: no limit")
    generate.add_argument("--top-p", type=arguments.top_p, default=1.0, help="above 0, at most 1")
    generate.add_argument("--seed", type=arguments.seed, help="0 … 2^64 - 1")
    generate.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    generate.add_argument("--dtype", choices=("float32", "bfloat16"), help="default: float32 on cpu, bfloat16 on cuda")
    generate.add_argument("--gpu-budget", type=arguments.sizes,
                          help="bytes the engine may use on the device, e.g. 8G; one per GPU to spread the experts "
                               "over several, e.g. 20G,20G")
    generate.add_argument("--ram-budget", type=arguments.size, help="bytes of host RAM for the expert store, e.g. 32G")
    generate.add_argument("--cpu-threads", type=arguments.cpu_threads, default=0, help=CPU_THREADS_HELP)
    generate.add_argument("--spec", choices=SPEC_METHODS, default="off",
                          help="speculative decoding: a DFlash drafter (--drafter), or GLM's own MTP layer")
    generate.add_argument("--drafter", help="DFlash drafter folder (with --spec dflash); demo: the demo model's")
    generate.add_argument("--block-size", type=arguments.positive_int,
                          help="positions every speculative step verifies (default: chosen per step by cost)")
    generate.add_argument("--json", action="store_true", help="print one JSON object instead of streaming text")

    serve = commands.add_parser("serve", help="answer the OpenAI API (chat and completions) over HTTP")
    serve.set_defaults(run=_run_serve)
    serve.add_argument("model", help="model folder (config.json + *.safetensors), or demo: the bundled demo model")
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on (not loopback: needs --api-key)")
    serve.add_argument("--port", type=arguments.port, default=8000)
    serve.add_argument("--api-key", help="clients must send 'Authorization: Bearer KEY' (every local user sees a "
                                         f"key given here: prefer --api-key-file or ${arguments.API_KEY_VARIABLE})")
    serve.add_argument("--api-key-file", help="read the API key from the first line of this file")
    serve.add_argument("--cors-origin", action="append", default=[],
                       help="a web page origin (e.g. http://localhost:3000, or *) whose scripts may call the API; "
                            "repeat for several (default: none, cross-origin browser requests are refused)")
    serve.add_argument("--docs", action="store_true", help="serve /docs, /redoc and /openapi.json (behind the key)")
    serve.add_argument("--model-name", help="the model's id in the API (default: the folder's name)")
    serve.add_argument("--context", type=arguments.positive_int, default=4096,
                       help="KV cache tokens, shared by the requests decoding together (one may use them all)")
    serve.add_argument("--max-batch", type=arguments.positive_int, default=8, help="requests decoded together")
    serve.add_argument("--max-queue", type=arguments.bounded_int(0, 1 << 20), default=16,
                       help="requests waiting beyond those; more get 429")
    serve.add_argument("--default-max-tokens", type=arguments.positive_int, default=1024,
                       help="the answer length of a request that gives no max_tokens, at most --context (so that "
                            "requests share the KV cache)")
    serve.add_argument("--max-body", type=arguments.size, default="8M",
                       help="the largest request body accepted; larger ones get 413")
    serve.add_argument("--engine-timeout", type=arguments.positive_seconds, default=30.0,
                       help="seconds without a sign of life from the engine process before it is restarted")
    serve.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    serve.add_argument("--dtype", choices=("float32", "bfloat16"), help="default: float32 on cpu, bfloat16 on cuda")
    serve.add_argument("--gpu-budget", type=arguments.size, help="bytes the engine may use on the device, e.g. 8G")
    serve.add_argument("--ram-budget", type=arguments.size, help="bytes of host RAM for the expert store, e.g. 32G")
    serve.add_argument("--cpu-threads", type=arguments.cpu_threads, default=0, help=CPU_THREADS_HELP)
    serve.add_argument("--spec", choices=SPEC_METHODS, default="off",
                       help="speculative decoding (then one request at a time): DFlash (--drafter) or GLM's MTP")
    serve.add_argument("--drafter", help="DFlash drafter folder (with --spec dflash)")
    serve.add_argument("--block-size", type=arguments.positive_int, help="positions every speculative step verifies")

    download = commands.add_parser("download", help="download a model from the Hugging Face hub (resumable)")
    download.set_defaults(run=_run_download)
    download.add_argument("repo_id", help="owner/name or the model's hub URL")
    download.add_argument("--revision", default="main")
    download.add_argument("--dir", help="target folder (default: the app's model library)")

    plan = commands.add_parser("plan", help="show where a model's bytes go under the given budgets")
    plan.set_defaults(run=_run_plan)
    plan.add_argument("model", help="model folder (config.json + *.safetensors), or demo: the bundled demo model")
    plan.add_argument("--gpu-budget", type=arguments.sizes, required=True, help="e.g. 8G, or one per GPU: 20G,20G")
    plan.add_argument("--ram-budget", type=arguments.size, required=True)
    plan.add_argument("--cpu-threads", type=arguments.cpu_threads, default=0,
                      help="predict with this many host cores computing part of the GPU's misses (the CPU expert "
                           "tier), beside the prediction without them; default 0: none")
    plan.add_argument("--context", type=arguments.positive_int, default=4096)
    plan.add_argument("--dtype", choices=("float32", "bfloat16"), help="default: float32 on cpu, bfloat16 on cuda")
    plan.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                      help="the device generate will run on (on cuda, dense FP8 weights stay FP8); cpu predicts "
                           "with the desktop app's CPU rates")
    plan.add_argument("--pcie-gen", type=int, choices=(3, 4, 5), help="PCIe generation of the x16 link (default 4)")
    plan.add_argument("--memory-bandwidth", type=arguments.positive_size,
                      help="device memory bandwidth per second, e.g. 1000GB (RTX 4090, the default), 4800GB (H200)")
    plan.add_argument("--json", action="store_true")
    return parser


def _run_generate(args) -> int:
    from app.engine.generation.sampling import SamplingParams
    from app.engine.session import Prompt, Session, collect
    from app.engine.spec.options import SpecOptions
    from app.model_folder import ModelFolder
    from app.paths import resolve_model
    from app.protocol.events import Done
    from app.protocol.kinds import PieceKind

    if args.prompt_ids is not None:
        prompt = Prompt(token_ids=args.prompt_ids)
    elif args.chat:
        system = [{"role": "system", "content": args.system}] if args.system else []
        prompt = Prompt(messages=[*system, {"role": "user", "content": args.prompt}],
                        reasoning_effort=args.reasoning_effort)
    else:
        prompt = Prompt(text=args.prompt)
    dtype = args.dtype or ("bfloat16" if args.device == "cuda" else "float32")
    drafter = resolve_model(args.drafter, drafter=True) if args.drafter else None
    ModelFolder.open(resolve_model(args.model)).check_context(args.max_new_tokens, "--max-new-tokens")
    session, ids = Session.open(
        resolve_model(args.model), prompt, args.max_new_tokens, spec=SpecOptions(args.spec, drafter, args.block_size),
        device=args.device, dtype=dtype, gpu_budget=args.gpu_budget, ram_budget=args.ram_budget,
        cpu_threads=args.cpu_threads,
    )
    sampling = SamplingParams(args.temperature, args.top_k, args.top_p, args.seed)
    events = session.generate(ids, sampling, args.max_new_tokens)
    if args.json:
        print(json.dumps(collect(events)))
        return 0
    for event in events:
        if isinstance(event, Done):
            print(f"\n[{event.stats.decode_tokens + 1} tokens, {event.stats.decode_tok_s:.1f} tok/s, "
                  f"stop: {event.stop_reason}]", file=sys.stderr)
            continue
        for kind, text in event.pieces:
            stream = sys.stdout if kind == PieceKind.ANSWER else sys.stderr
            stream.write(text)
            stream.flush()
    return 0


def _run_serve(args) -> int:
    from pathlib import Path

    from app.engine.spec.options import SpecOptions
    from app.model_folder import ModelFolder
    from app.paths import resolve_model
    from app.protocol.requests import LoadModel
    from app.server.serve import ServerOptions, serve

    folder = ModelFolder.open(resolve_model(args.model))
    folder.check_context(args.context, "--context")
    options = ServerOptions(args.host, args.port, arguments.api_key(args.api_key, args.api_key_file),
                            args.model_name or Path(folder.path).name, args.max_queue, tuple(args.cors_origin),
                            args.docs, args.max_body, args.default_max_tokens, args.engine_timeout)
    drafter = resolve_model(args.drafter, drafter=True) if args.drafter else None
    spec = SpecOptions(args.spec, drafter, args.block_size)
    dtype = args.dtype or ("bfloat16" if args.device == "cuda" else "float32")
    request = LoadModel(str(folder.path), args.device, dtype, args.gpu_budget, args.ram_budget, args.context,
                        spec.method, spec.drafter, spec.block_size, args.max_batch, args.cpu_threads)
    serve(request, options)
    return 0


def _plan_hardware(args):
    """The rates to predict with: the app's CPU figures on cpu, a card on cuda; flags given replace either's."""
    from dataclasses import replace

    from app.plan import PCIE_BPS, Hardware
    from app.plan_cpu import CPU_HARDWARE

    hardware = CPU_HARDWARE if args.device == "cpu" else Hardware()
    if args.pcie_gen is not None:
        hardware = replace(hardware, link_bps=PCIE_BPS[args.pcie_gen])
    if args.memory_bandwidth is not None:
        hardware = replace(hardware, memory_bps=args.memory_bandwidth)
    return hardware


def _run_plan(args) -> int:
    from app.model_folder import ModelFolder
    from app.paths import resolve_model
    from app.plan import ModelFacts, dtype_bytes
    from app.plan_cpu_tier import cpu_tier_idle, tier_worth_it
    from app.plan_gpus import plan_budgets, predict_gpus
    from app.sizes import format_size

    dtype = args.dtype or ("bfloat16" if args.device == "cuda" else "float32")
    facts = ModelFacts.from_folder(ModelFolder.open(resolve_model(args.model)), fp8_kept=args.device == "cuda")
    placement, gpus = plan_budgets(facts, args.gpu_budget, args.ram_budget, args.context, dtype_bytes(dtype))
    hardware = _plan_hardware(args)
    without_tier = predict_gpus(facts, placement, gpus, dtype_bytes(dtype), hardware)
    prediction = predict_gpus(facts, placement, gpus, dtype_bytes(dtype), hardware, args.cpu_threads) \
        if args.cpu_threads else without_tier
    idle = cpu_tier_idle(facts, placement, hardware, len(gpus))
    if args.json:
        print(json.dumps({**placement.__dict__, "device_bytes": placement.device_bytes,
                          "total_experts": facts.total_experts, "prediction": prediction.as_dict(),
                          "cpu_threads": args.cpu_threads, "cpu_tier_idle": idle,
                          "prediction_without_cpu_tier": without_tier.as_dict(), "hardware": asdict(hardware),
                          "gpus": [{"expert_slots": g.expert_slots, "device_bytes": g.device_bytes} for g in gpus]}))
        return 0
    per_gpu = [(f"GPU {index}: {gpu.expert_slots} expert slots", format_size(gpu.device_bytes))
               for index, gpu in enumerate(gpus)]
    rows = [
        ("resident weights", format_size(placement.resident_bytes)),
        (f"KV cache ({placement.context} tokens)", format_size(placement.kv_cache_bytes)),
        ("workspace", format_size(placement.workspace_bytes)),
        (f"expert slots ({placement.expert_slots} of {facts.total_experts})", format_size(placement.slot_bytes)),
        *per_gpu,
        (f"pinned RAM store ({placement.host_experts} experts)", format_size(placement.host_bytes)),
        (f"read from disk ({placement.disk_experts} experts)", format_size(placement.disk_bytes)),
        (f"expert-cache hit rate ({prediction.routing})", f"{prediction.hit_rate:.0%}"),
        ("fetched per token", format_size(prediction.fetched_bytes_per_token)),
        (f"decode ({'CPU' if args.device == 'cpu' else 'GPU'}, {hardware.memory_bps / 1e9:.0f} GB/s memory)",
         _speeds(prediction)),
    ]
    if args.cpu_threads:
        rows += [(f"CPU expert tier ({args.cpu_threads} thread{'s' if args.cpu_threads > 1 else ''})",
                  f"{prediction.cpu_experts_per_token:.1f} experts/token"),
                 ("decode without the CPU tier", _speeds(without_tier))]
    for label, value in [*rows, ("limited by", prediction.bound)]:
        print(f"{label:<40} {value:>12}")
    if args.cpu_threads and idle:
        print(f"the CPU expert tier computes no experts here: {idle}")
    suggested = arguments.host_cores() - 1
    if not args.cpu_threads and idle is None and suggested > 0:
        with_tier = predict_gpus(facts, placement, gpus, dtype_bytes(dtype), hardware, suggested)
        if tier_worth_it(with_tier, prediction):
            print(f"with --cpu-threads {suggested} (the CPU computing part of the misses): {_speeds(with_tier)}")
    return 0


def _speeds(prediction) -> str:
    return f"{prediction.tok_s_low:.1f}–{prediction.tok_s_high:.1f} tok/s"


def _run_download(args) -> int:
    from pathlib import Path

    from app.hub import KNOWN_DRAFTERS, Download, parse_repo_id, write_manifest
    from app.paths import model_folder_for
    from app.sizes import format_size

    repo_id = parse_repo_id(args.repo_id)
    download = Download(repo_id, Path(args.dir) if args.dir else model_folder_for(repo_id), args.revision)
    print(f"{repo_id} @ {download.commit[:12]}: {len(download.files)} files, {format_size(download.total_bytes)}, "
          f"{format_size(download.missing_bytes())} to fetch into {download.folder}", file=sys.stderr)

    def report(progress) -> None:
        eta = f"{progress.eta_s:.0f} s left" if progress.eta_s is not None else ""
        print(f"\r{progress.file}: {format_size(progress.done)} of {format_size(progress.total)}, "
              f"{format_size(progress.speed_bps)}/s {eta}   ", end="", file=sys.stderr, flush=True)

    try:
        completed = download.run(report)
    finally:
        print(file=sys.stderr)  # ends the progress line
    if not completed:
        raise UserError("the download stopped before every file was verified: run it again to resume")
    write_manifest(download)
    print(f"done: {download.folder} ({len(download.files)} files verified)", file=sys.stderr)
    if repo_id in KNOWN_DRAFTERS:
        print(f"a DFlash drafter exists for this model: moechat download {KNOWN_DRAFTERS[repo_id]}", file=sys.stderr)
    return 0


def _run_app(args) -> int:
    from app.ui.main import run_app

    return run_app()
