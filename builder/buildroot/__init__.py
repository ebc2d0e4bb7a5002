"""Build roots: an old OS's compiler, headers and C library that the op units compile and link in.

A wheel compiled on the build host needs the host's glibc and libstdc++ symbol versions (Debian 12:
GLIBC_2.34, GLIBCXX_3.4.30: manylinux_2_35), which RHEL 8/9, Debian 11 and Ubuntu 20.04 nodes lack.
The toolkit therefore compiles in a root of an older OS (Debian 11 by default, made once per machine
with debootstrap; or a site's folder or OCI image), while Python, torch, ninja and ccache stay on the
host: the compiler wrappers in the build's private toolchain folder enter the root in a mount
namespace of their own, with the build's folders bound in at the same paths.

- spec: what a root is made of and its key, the wrapper scripts, the pinned symbols (pure).
- make: making (debootstrap) or exporting (podman) a root into the roots folder, once.
- sandbox: checking that a root may be trusted, and writing the wrappers that enter it.
- pack: a made root as one file, for `gather`'s folder, unpacked on a node with no Debian mirror.
"""
