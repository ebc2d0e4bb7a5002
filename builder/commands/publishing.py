"""The wheelhouse's commands: publish, verify, sign, key, repair, lock, image, prune, serve.

Errors are raised, never printed here; `cli.main` turns them into one message and an exit code.
Each handler imports what it needs: a command's start stays fast."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from builder import output
from builder.commands.common import _passed_wheels, _trust_arg, _workspace
from builder.errors import UsageError, WheelhouseError


def publish(args: argparse.Namespace) -> int:
    from builder import pipeline

    ws = _workspace(args)
    if args.wheels or not args.proofs:
        pipeline.publish(args.wheels or _passed_wheels(ws.dist), args.wheelhouse, ws, variants=args.variants)
    if args.proofs:
        from builder.wheelhouse.publish import take_in_proofs

        names = take_in_proofs(args.wheelhouse, args.proofs, args.unsigned_proof)
        output.step(f"{args.wheelhouse}: took in {len(names)} GPU proof(s), signed into its manifest")
    return 0


def verify(args: argparse.Namespace) -> int:
    from builder import signing
    from builder.node import fingerprint_of, printable
    from builder.wheelhouse import verify as verify_wheelhouse
    from builder.wheelhouse.layout import changed_since_signed, read_manifest, signed_by
    from builder.wheelhouse.verify import signature_problems

    house: Path = args.wheelhouse
    trust = _trust_arg(args)
    problems = verify_wheelhouse(house, trust)
    if args.json:
        output.result(json.dumps({"wheelhouse": str(house), "ok": not problems, "problems": problems}, indent=2))
    if problems:
        found = read_manifest(house) if house.is_dir() and (house / "manifest.json").is_file() else None
        signature = found is not None and any("interrupted publish" not in p for p in
                                              signature_problems(house, *found, trust))  # fmt: skip
        placed = house / "manifest.json"
        own = signing.keys().key() if signing.keys().exists() else None
        if house.is_dir() and (placed.is_symlink() or (placed.exists() and not placed.is_file())):
            fix = "restore the wheelhouse from the build host, or move it away and re-publish into a new one"
        elif any("interrupted publish" in p for p in problems) and not (house / "manifest.json").exists():
            fix = "run `python -m builder repair` to remove what the interrupted publish left, then publish again"
        elif not house.is_dir() or not (house / "manifest.json").is_file():
            fix = "pass --wheelhouse with the folder publish wrote (build-wheel publishes into ./wheelhouse)"
        elif any("publish is in progress" in p for p in problems):
            fix = "wait for the publish to finish, then run verify again"
        elif signature and not (house / "manifest.json.sig").exists():  # unsigned: an older toolkit, or stripped
            fix = (
                "do not install from it until it verifies: restore the wheelhouse from the build host; if it is "
                "what an older toolkit published there, check what it lists, then `python -m builder sign --adopt`"
            )
        elif signature and own is not None and signed_by(house / "manifest.json.sig", own):
            fix = changed_since_signed(own)  # this host is the one that signed it: not "re-sign it there"
        elif signature:  # the signature is checked first: nothing else about the wheelhouse is known then
            fix = (
                "do not install from it: its signature is what vouches for every file. Restore the wheelhouse "
                "from the build host that signed it, or re-sign it there with `python -m builder sign`"
            )
        elif any("interrupted publish" in p or "builder repair" in p for p in problems):
            fix = ("run `python -m builder repair` for what interrupted publishes left; for anything else, "
                   "re-publish the affected wheels from their builds into a new wheelhouse")  # fmt: skip
        else:
            fix = "re-publish the affected wheels into a new wheelhouse; remove files you did not publish"
        shown = [printable(p) for p in problems]  # a planted file's name may hold a newline or ESC
        raise WheelhouseError(f"{house} failed verification:\n    " + "\n    ".join(shown), fix)
    found = read_manifest(house)  # verified above: its signer is the key that signed it (check_signer)
    assert found is not None
    manifest = found[1]
    extra = "".join(f", {len(table)} {what}" for table, what in ((manifest.images, "images"),
                    (manifest.variants, "variant wheels")) if table)  # fmt: skip
    output.step(f"{house}: {len(manifest.wheels)} wheels{extra}; signature, hashes, metadata, smoke reports, index, "
                "page and manifest agree")  # fmt: skip
    k = signing.keys()
    whose = " (this host's key)" if k.exists() and k.key().line() == manifest.signer else ""
    output.step(f"signed by {fingerprint_of(manifest.signer)}{whose}: serial {manifest.serial}, valid until "
                f"{manifest.expires}; wheelhouse id {manifest.wheelhouse_id}")  # fmt: skip
    return 0


def sign(args: argparse.Namespace) -> int:
    from builder import signing
    from builder.errors import RecipeError
    from builder.wheelhouse.upkeep import resign

    days = args.days if args.days is not None else signing.sign_days()
    if not 1 <= days <= 3660:
        raise RecipeError(f"--days {days} is not from 1 to 3660", "give how many days the signature stays valid")
    manifest = resign(args.wheelhouse, days, adopt=args.adopt, new_id=args.new_id)
    if args.new_id:
        output.note(f"{args.wheelhouse} is now wheelhouse {manifest.wheelhouse_id}: a node that read it before "
                    f"refuses it until told once, `--wheelhouse-id {manifest.wheelhouse_id}` (provision tells "
                    "it)")  # fmt: skip
    output.step(f"{args.wheelhouse}: manifest signed by {signing.keys().key().fingerprint()}: serial "
                f"{manifest.serial}, valid until {manifest.expires}")  # fmt: skip
    return 0


def key(args: argparse.Namespace) -> int:
    from builder import signing
    from builder.errors import TrustError

    k = signing.keys()
    if args.action == "create":
        signing.create(k)
    elif args.action == "rotate":
        if not k.exists():
            secret = signing.new_unit_secret(k)  # a host with no ssh-keygen has only its unit secret
            if secret is None:
                raise TrustError(f"no signing key in {k.folder} to rotate", "`python -m builder key create`")
            output.step(f"a new unit secret in {secret}: the op units the old one sealed are built again")
            return 0
        old = k.key()
        signing.check_unit_secret_place(k)  # before anything rotates
        new = signing.create(k, rotate=True)
        if (secret := signing.new_unit_secret(k)) is not None:
            output.note(f"a new unit secret in {secret} too: the op units the old one sealed are built again")
        output.note(
            f"the old key {old.fingerprint()} stays trusted until you revoke it: give nodes the new "
            f"allowed_signers ({k.trust_file}), re-sign every wheelhouse (`python -m builder sign`), then "
            f"`python -m builder key revoke {old.fingerprint()}`; this host now signs with {new.fingerprint()}"
        )
    elif args.action == "trust":
        if args.prover:
            from builder import prover

            signing.check_folder(k)
            added = prover.trust_prover(k.folder, args.prover)
            output.step(f"this host now takes in GPU proofs signed by {added.fingerprint()} "
                        f"({k.folder / prover.TRUST_FILE})")  # fmt: skip
            return 0
        if not args.value:
            raise UsageError("key trust needs the key line", "python -m builder key trust 'ssh-ed25519 AAAA...'")
        added = signing.trust_key(k, args.value)
        output.step(f"this host now trusts {added.fingerprint()} ({k.trust_file})")
        if not k.exists():  # nothing more to show: this host signs nothing yet (key trust once exited 13 here)
            output.note(f"this host has no signing key of its own yet in {k.folder}: its first publish makes one")
            return 0
    elif args.action == "revoke":
        if not args.value:
            raise UsageError("key revoke needs the key's fingerprint", "python -m builder key revoke SHA256:...")
        gone = signing.revoke_key(k, args.value)
        output.step(f"revoked {gone.fingerprint()}: give nodes the new {k.trust_file}; its signatures are refused")
    if args.action == "show" or args.action in ("trust", "revoke"):
        if not k.exists():
            raise TrustError(f"no signing key in {k.folder}", "make one: `python -m builder key create` (the "
                             "first publish makes one too)")  # fmt: skip
        trust = k.trust()
        output.step(f"signing key {k.private} ({k.key().fingerprint()}); trusted: {trust.describe()}")
        if trust.revoked:
            output.note(f"revoked: {', '.join(r.fingerprint() for r in trust.revoked)}")
        output.note(f"nodes: --trust '{k.key().line()}', or --trust with a copy of {k.trust_file} (every trusted and "
                    "revoked key), installed on nodes as /etc/ds-node-install/allowed_signers")  # fmt: skip
        output.result(k.key().line())
    return 0


def repair(args: argparse.Namespace) -> int:
    from builder.wheelhouse import repair as repair_wheelhouse

    removed = repair_wheelhouse(args.wheelhouse)
    output.step(f"{args.wheelhouse}: removed {len(removed)} leftovers; index rewritten from manifest.json")
    return 0


def lock(args: argparse.Namespace) -> int:
    from builder.wheelhouse.lock import lock as lock_wheel

    ws = _workspace(args)
    lock_wheel(args.wheelhouse, args.wheel, ws.logs / "lock.log")
    return 0


def image(args: argparse.Namespace) -> int:
    from builder.images.build import build_image

    ws = _workspace(args)
    result = build_image(args.wheelhouse, ws, lock=args.lock, wheel=args.wheel, base=args.base,
                         publish=not args.no_publish, verbose=args.verbose, smoke=not args.no_smoke,
                         squashfs=args.squashfs)  # fmt: skip
    where = result.archive or "(not published: --no-publish)"
    output.step(f"image {result.ref}: ID {result.image_id[:12]}, {result.size / 1e6:.0f} MB archive (sha256 "
                f"{result.sha256[:16]}...) {where}")  # fmt: skip
    if result.squashfs_sha256:
        output.step(f"squashfs {result.squashfs_size / 1e6:.0f} MB (sha256 {result.squashfs_sha256[:16]}...) "
                    f"{result.squashfs or '(not published: --no-publish)'}")  # fmt: skip
    if result.archive is not None:
        output.result(f"load it with: podman load -i {result.archive}  (or docker load -i ...)")
        if result.squashfs is not None:
            output.result(f"run it with Slurm (Pyxis): srun --container-image={result.squashfs} python -c "
                          "'import deepspeed'")  # fmt: skip
    return 0


def prune(args: argparse.Namespace) -> int:
    from builder.errors import RecipeError
    from builder.recipe import load_recipe
    from builder.wheelhouse import prune as prune_wheelhouse
    from builder.wheelhouse.lock import locked_wheels

    folder: Path = args.recipes_dir
    if not folder.is_dir():
        raise RecipeError(f"the recipes folder {folder} does not exist (prune keeps the wheels of its recipes)",
                          "run prune from the checkout that holds recipes/, or pass --recipes-dir")  # fmt: skip
    names = [load_recipe(p).name for p in sorted(folder.glob("*.toml"))]
    if not names:
        raise RecipeError(f"{folder} holds no recipe (*.toml): prune would keep nothing",
                          "pass --recipes-dir with the folder of your recipes")  # fmt: skip
    gone = prune_wheelhouse(args.wheelhouse, names, locked_wheels(args.wheelhouse), args.dry_run, args.remove_all)
    verb = "would remove" if args.dry_run else "removed"
    output.result("\n".join(f"{verb} {name}" for name in gone))
    output.step(f"{verb} {len(gone)} wheels; kept those of recipes {', '.join(names)} and of locks")
    return 0


def serve(args: argparse.Namespace) -> int:
    from builder.wheelhouse.serve import serve as serve_wheelhouse

    serve_wheelhouse(args.wheelhouse, args.bind, args.port)
    return 0
