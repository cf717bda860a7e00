"""`vbc certs create-ca|create-node|create-client|list`: the certificates of a secure cluster."""
from __future__ import annotations

import argparse
import sys
import time

from vbc.cli.arguments import absolute_path, add_command, add_command_group, positive_int


def add_certs_parser(commands) -> None:
    certs_commands = add_command_group(commands, "certs",
                                       "certificates of a secure cluster: a CA, node and client certificates")
    lifetime = lifetime_options()

    create_ca = add_command(certs_commands, "create-ca", cmd_certs, parents=[lifetime],
                            help="make the cluster's CA: DIR/ca.crt and its key (DIR/ca.key, or "
                                 "--ca-key PATH: keep it apart)")
    create_ca.add_argument("directory", type=absolute_path, metavar="DIR")
    create_ca.set_defaults(certs_action=certs_create_ca)

    create_node = add_command(certs_commands, "create-node", cmd_certs, parents=[lifetime],
                              help="make node.crt and node.key for a node, signed by DIR's CA")
    create_node.add_argument("directory", type=absolute_path, metavar="DIR", help="the directory of the CA")
    create_node.add_argument("node_id", metavar="NODE_ID")
    create_node.add_argument("--host", dest="hosts", action="append", required=True, metavar="H",
                             help="an IP address or DNS name the node is reached at (repeat for each)")
    create_node.add_argument("--out", type=absolute_path, metavar="OUTDIR",
                             help="write the files here, with a copy of ca.crt (default: DIR)")
    create_node.set_defaults(certs_action=certs_create_node)

    create_client = add_command(certs_commands, "create-client", cmd_certs, parents=[lifetime],
                                help="make client.USER.crt and client.USER.key, signed by DIR's CA")
    create_client.add_argument("directory", type=absolute_path, metavar="DIR", help="the directory of the CA")
    create_client.add_argument("user", metavar="USER")
    create_client.add_argument("--out", type=absolute_path, metavar="OUTDIR",
                               help="write the files here, with a copy of ca.crt (default: DIR)")
    create_client.set_defaults(certs_action=certs_create_client)

    listing = add_command(certs_commands, "list", cmd_certs,
                          help="the certificates of a directory: kind, name, hosts, expiry")
    listing.add_argument("directory", type=absolute_path, metavar="DIR")
    listing.set_defaults(certs_action=certs_list)


def lifetime_options() -> argparse.ArgumentParser:
    """The options of the commands that make a certificate: its lifetime, overwriting, where the CA key is."""
    lifetime = argparse.ArgumentParser(add_help=False)
    lifetime.add_argument("--lifetime-days", type=positive_int, metavar="N",
                          help="days the certificate is valid (default: 10 years for a CA, 5 for the others)")
    lifetime.add_argument("--overwrite", action="store_true", help="replace the files if they exist")
    lifetime.add_argument("--ca-key", type=absolute_path, metavar="PATH",
                          help="the CA's private key (default: DIR/ca.key); keep it apart from what nodes and "
                               "clients are given, e.g. in a folder only you can read")
    return lifetime


def cmd_certs(args: argparse.Namespace) -> int:
    """Run a `vbc certs` command. common.certs is imported here: cryptography's x509 takes ~45 ms to load."""
    from common.certs import CertificateError

    try:
        return args.certs_action(args)
    except CertificateError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1


def lifetime_option(args: argparse.Namespace) -> dict:
    """lifetime_days for the certs functions when --lifetime-days is given (their own defaults otherwise)."""
    return {} if args.lifetime_days is None else {"lifetime_days": args.lifetime_days}


def certs_create_ca(args: argparse.Namespace) -> int:
    from common import certs

    cert_path = certs.create_ca(args.directory, overwrite=args.overwrite, ca_key=args.ca_key,
                                **lifetime_option(args))
    print(f"CA: {cert_path} and {certs.ca_key_path(args.directory, args.ca_key)} (the key signs every certificate "
          "of the cluster: keep it away from the nodes and clients)")
    return 0


def certs_create_node(args: argparse.Namespace) -> int:
    from common import certs

    cert_path, key_path = certs.create_node_cert(args.directory, args.node_id, args.hosts, out_dir=args.out,
                                                 overwrite=args.overwrite, ca_key=args.ca_key,
                                                 **lifetime_option(args))
    print(f"node {args.node_id}: {cert_path} and {key_path}, for hosts {', '.join(certs.unique(args.hosts))}")
    return 0


def certs_create_client(args: argparse.Namespace) -> int:
    from common import certs

    cert_path, key_path = certs.create_client_cert(args.directory, args.user, out_dir=args.out,
                                                   overwrite=args.overwrite, ca_key=args.ca_key,
                                                   **lifetime_option(args))
    print(f"client {args.user}: {cert_path} and {key_path}")
    return 0


def certs_list(args: argparse.Namespace) -> int:
    from common import certs

    now = time.time()
    for info in certs.list_certificates(args.directory):
        print(certificate_line(info, now))
    return 0


def certificate_line(info, now: float) -> str:
    """One line of `vbc certs list`: file, kind and name, hosts, expiry, subject."""
    if info.kind == "invalid":
        return f"{info.file.name}: invalid: {info.problem}"
    who = f"{info.kind} {info.name}" if info.name else info.kind
    hosts = f", hosts {' '.join(info.hosts)}" if info.hosts else ""
    expired = "EXPIRED" if info.expires.timestamp() <= now else "expires"
    return f"{info.file.name}: {who}{hosts}, {expired} {info.expires:%Y-%m-%d %H:%M} UTC ({info.subject})"
