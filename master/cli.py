"""`squall master`: run a master server."""

from __future__ import annotations

import logging
from pathlib import Path

import typer

from squall.master.service import MasterSettings


def serve(data_dir: str, host: str, port: int, fsync: bool = True,
          checkpoint_interval_s: float = 30.0) -> None:
    import uvicorn

    from squall.master.app import create_master_app

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    settings = MasterSettings(data_dir=data_dir, fsync=fsync,
                              checkpoint_interval_s=checkpoint_interval_s)
    uvicorn.run(create_master_app(settings), host=host, port=port, loop="uvloop",
                http="httptools", access_log=False, log_level="warning", lifespan="on")


def register(app: typer.Typer) -> None:
    @app.command("master")
    def master(
        data_dir: Path = typer.Option(Path(".squall/master"), "--data-dir",
                                      envvar="SQUALL_DATA_DIR",
                                      help="where the WAL and the LMDB index live"),
        host: str = typer.Option("127.0.0.1", envvar="SQUALL_HOST", help="address to bind"),
        port: int = typer.Option(7070, envvar="SQUALL_PORT", help="port to listen on"),
        fsync: bool = typer.Option(True, envvar="SQUALL_FSYNC",
                                   help="fdatasync the WAL before answering (never turn off "
                                        "in production)"),
        checkpoint_interval_s: float = typer.Option(30.0, envvar="SQUALL_CHECKPOINT_INTERVAL_S",
                                                    help="seconds between LMDB checkpoints"),
    ) -> None:
        """Run a master: task metadata, leases, WAL + LMDB index."""
        serve(str(data_dir), host, port, fsync, checkpoint_interval_s)
