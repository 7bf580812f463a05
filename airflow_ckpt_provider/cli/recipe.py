"""`ckpt recipe kubernetes|yarn|single-host`: the production recipes of docs/deployment.md, rendered for a job store.

Prints the files (each after a `# ==> NAME <==` line) or, with `--out DIR`, writes them there. Nothing is applied.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from airflow_ckpt_provider.cli.common import emit
from airflow_ckpt_provider.launcher.recipes import DRIVER_FORMS, FORMS, RecipeSettings, render
from airflow_ckpt_provider.launcher.sparkapp import IMAGE_ENTRYPOINT


def cmd_recipe(args: argparse.Namespace) -> int:
    settings = RecipeSettings(
        store=args.store or "", namespace=args.namespace, image=args.image or "", replicas=args.replicas,
        credentials_secret=args.credentials_secret, endpoint_url=args.endpoint_url, region=args.region,
        upload_path=args.upload_path, driver_form=args.drivers, job=args.job, job_file=args.job_file,
        checkpoint=args.checkpoint, entrypoint=args.entrypoint)
    files = render(args.form, settings)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        for name, text in files.items():
            (out / name).write_text(text)
    emit(args, {"files": files, "written_to": args.out},
         lambda: f"wrote {', '.join(files)} to {args.out}" if args.out else
         "\n".join(f"# ==> {name} <==\n{text}" for name, text in files.items()))
    return 0


def add_recipe_command(groups: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = groups.add_parser("recipe", help="render a production recipe: Kubernetes, YARN or one host",
                          description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.set_defaults(fn=cmd_recipe)
    p.add_argument("form", choices=FORMS, help="where the service and the drivers run")
    p.add_argument("--store", default=os.environ.get("CKPT_STORE"),
                   help="job store root every host reads: s3://BUCKET/PREFIX (env CKPT_STORE)")
    p.add_argument("--endpoint-url", help="S3 endpoint URL, where not AWS (written into the recipe)")
    p.add_argument("--region", help="S3 region (written into the recipe)")
    p.add_argument("--credentials-secret", default="ckpt-store-credentials", metavar="NAME",
                   help="Kubernetes: the secret with AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (default "
                        "ckpt-store-credentials; '' for a workload identity)")
    p.add_argument("--namespace", default="streaming", help="Kubernetes namespace (default streaming)")
    p.add_argument("--image", help="Kubernetes: the image with Spark, Python and this provider")
    p.add_argument("--replicas", type=int, default=2, help="service instances (pods or edge hosts; default 2)")
    p.add_argument("--upload-path", help="Kubernetes: where spark-submit uploads a driver pod's files (default "
                                         "s3a://<store bucket>/spark-uploads)")
    p.add_argument("--drivers", choices=DRIVER_FORMS, default="driver-pods",
                   help="Kubernetes: driver pods submitted by spark-submit (default), or SparkApplications of the "
                        "Kubeflow Spark operator, both restarted by the service only")
    p.add_argument("--entrypoint", default=IMAGE_ENTRYPOINT,
                   help="--drivers sparkapplication: the runtime's entrypoint.py in the image (default "
                        f"{IMAGE_ENTRYPOINT})")
    p.add_argument("--job", help="--drivers sparkapplication: the job's name")
    p.add_argument("--job-file", help="--drivers sparkapplication: the job file as a URI the cluster reads")
    p.add_argument("--checkpoint", help="--drivers sparkapplication: the live checkpoint (s3a://...)")
    p.add_argument("--out", metavar="DIR", help="write the files into DIR instead of printing them")
    p.add_argument("--json", action="store_true", help="print JSON for scripts")
    p.add_argument("-v", "--verbose", action="store_true", help="log every step")
