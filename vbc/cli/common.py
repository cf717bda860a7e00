"""What every `vbc` client command shares: usage errors, the addresses it targets (and logs in to), JSON lines."""
from __future__ import annotations

import argparse
import getpass
import json
import os
import sys
from pathlib import Path

from vbc import client

ADDR_ENV = "VBC_ADDR"
NO_TARGET_MESSAGE = "give --addr HOST:PORT or --cluster DIR"


class UsageError(Exception):
    """A usage problem found after parsing; reported like argparse does (exit status 2)."""


def target_addresses(args: argparse.Namespace) -> list[str]:
    """The addresses named by --addr, --cluster or $VBC_ADDR (comma separated), connected to with --credentials,
    or logged in to with --user."""
    if getattr(args, "user", None):
        return login_addresses(args)
    addresses = named_addresses(args)
    if getattr(args, "credentials", None):
        client.use_credentials(client.credentials_from(args.credentials), addresses)
    return addresses


def login_addresses(args: argparse.Namespace) -> list[str]:
    """--user: the client ports of --cluster's nodes (or --addr, $VBC_ADDR as given), with a password login."""
    ca_folder = args.credentials or os.environ.get(client.CREDENTIALS_ENV)
    if args.cluster:
        addresses = client.login_addresses_from_cluster(args.cluster)
        ca_folder = ca_folder or Path(args.cluster) / client.CREDENTIALS_DIR
    else:
        addresses = named_addresses(args)
    if not ca_folder:
        raise UsageError("--user needs the cluster's CA certificate: give --credentials DIR (holding ca.crt), "
                         f"${client.CREDENTIALS_ENV}, or --cluster DIR")
    from common.certs import CertificateError
    try:
        credentials = client.login_credentials(args.user, login_password(args.user), ca_folder)
    except CertificateError as error:
        raise UsageError(str(error)) from None
    client.use_credentials(credentials, addresses)
    return addresses


def login_password(user: str) -> str:
    """$VBC_PASSWORD, else asked on the terminal (never an argument: arguments show in `ps`)."""
    password = os.environ.get(client.PASSWORD_ENV)
    if password is None:
        if not sys.stdin.isatty():
            raise UsageError(f"--user {user} needs a password: set ${client.PASSWORD_ENV} or run on a terminal")
        password = getpass.getpass(f"password for {user}: ")
    return password


def named_addresses(args: argparse.Namespace) -> list[str]:
    if args.addr:
        return [args.addr]
    if args.cluster:
        return client.addresses_from_cluster(args.cluster)
    from_env = [a.strip() for a in os.environ.get(ADDR_ENV, "").split(",") if a.strip()]
    if from_env:
        return from_env
    raise UsageError(NO_TARGET_MESSAGE)


def json_line(document: object) -> str:
    return json.dumps(document, ensure_ascii=False)
