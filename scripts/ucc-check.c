// ucc-check: proves that the real libucc loads and works where it runs, the
// way the ucc backend will use it: dlopen libucc.so.1 (argv[1], else
// GOCOLL_UCC_LIBRARY, else the loader's search), print its version, then
// ucc_init (which loads the CL/TL components: without libucc-dev's component
// .so links it fails with "no CL components were found") and a one-rank
// context (which starts UCX: the check that UCX_MODULE_DIR points at modules
// matching the libucx that libucc uses). scripts/ucc-check.sh builds it with
// the headers of the root (or of the unpacked libucc-dev) and runs it.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <link.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <ucc/api/ucc.h>

// The functions are looked up with dlsym, as the backend does, so the program
// links against nothing but libc and runs wherever libucc can be opened.
static void *lib;

static void *sym(const char *name) {
	void *p = dlsym(lib, name);
	if (p == NULL) {
		fprintf(stderr, "ucc-check: %s: %s\n", name, dlerror());
		exit(1);
	}
	return p;
}

// A one-rank OOB allgather: the context's address exchange with itself.
static ucc_status_t oob_allgather(void *src, void *dst, size_t size, void *info, void **req) {
	(void)info;
	memcpy(dst, src, size);
	*req = dst;
	return UCC_OK;
}
static ucc_status_t oob_test(void *req) {
	(void)req;
	return UCC_OK;
}
static ucc_status_t oob_free(void *req) {
	(void)req;
	return UCC_OK;
}

// loaded_from prints the directories that UCC and UCX libraries and modules
// were mapped from, with a count each: where sid's libucx and the machine's
// own UCX both exist, this shows which one's modules were loaded.
static void loaded_from(void) {
	FILE *f = fopen("/proc/self/maps", "r");
	if (f == NULL) {
		return;
	}
	char dirs[32][512];
	char names[256][256];
	int ndirs = 0, nnames = 0, count[32] = {0};
	char line[1024];
	while (fgets(line, sizeof line, f) != NULL) {
		char *p = strchr(line, '/');
		if (p == NULL) {
			continue;
		}
		p[strcspn(p, "\n")] = 0;
		char *base = strrchr(p, '/') + 1;
		if (strncmp(base, "libuc", 5) != 0) {
			continue;
		}
		int seen = 0;
		for (int i = 0; i < nnames; i++) {
			seen |= strcmp(names[i], p) == 0;
		}
		if (seen || nnames == 256) {
			continue;
		}
		snprintf(names[nnames++], sizeof names[0], "%s", p);
		size_t dl = (size_t)(base - 1 - p);
		int d = 0;
		while (d < ndirs && !(strlen(dirs[d]) == dl && strncmp(dirs[d], p, dl) == 0)) {
			d++;
		}
		if (d == ndirs) {
			if (ndirs == 32) {
				continue;
			}
			snprintf(dirs[ndirs++], sizeof dirs[0], "%.*s", (int)dl, p);
		}
		count[d]++;
	}
	fclose(f);
	for (int d = 0; d < ndirs; d++) {
		printf("ucc-check: %d libuc* files mapped from %s\n", count[d], dirs[d]);
	}
}

int main(int argc, char **argv) {
	const char *path = argc > 1 ? argv[1] : getenv("GOCOLL_UCC_LIBRARY");
	if (path == NULL || *path == 0) {
		path = "libucc.so.1";
	}
	lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	if (lib == NULL) {
		fprintf(stderr, "ucc-check: dlopen %s: %s\n", path, dlerror());
		return 1;
	}
	struct link_map *lm = NULL;
	dlinfo(lib, RTLD_DI_LINKMAP, &lm);

	const char *(*version)(void) = sym("ucc_get_version_string");
	const char *(*status_string)(ucc_status_t) = sym("ucc_status_string");
	ucc_status_t (*lib_config_read)(const char *, const char *, ucc_lib_config_h *) = sym("ucc_lib_config_read");
	void (*lib_config_release)(ucc_lib_config_h) = sym("ucc_lib_config_release");
	ucc_status_t (*init_version)(unsigned, unsigned, const ucc_lib_params_t *, const ucc_lib_config_h, ucc_lib_h *) =
		sym("ucc_init_version");
	ucc_status_t (*finalize)(ucc_lib_h) = sym("ucc_finalize");
	ucc_status_t (*ctx_config_read)(ucc_lib_h, const char *, ucc_context_config_h *) = sym("ucc_context_config_read");
	void (*ctx_config_release)(ucc_context_config_h) = sym("ucc_context_config_release");
	ucc_status_t (*ctx_create)(ucc_lib_h, const ucc_context_params_t *, const ucc_context_config_h, ucc_context_h *) =
		sym("ucc_context_create");
	ucc_status_t (*ctx_destroy)(ucc_context_h) = sym("ucc_context_destroy");

	printf("ucc-check: libucc %s (%s; headers %s)\n", version(), lm ? lm->l_name : path, UCC_VERSION_STRING);

	ucc_lib_config_h lcfg;
	ucc_status_t st = lib_config_read(NULL, NULL, &lcfg);
	if (st != UCC_OK) {
		fprintf(stderr, "ucc-check: ucc_lib_config_read: %s\n", status_string(st));
		return 1;
	}
	ucc_lib_params_t lp = {.mask = UCC_LIB_PARAM_FIELD_THREAD_MODE, .thread_mode = UCC_THREAD_SINGLE};
	ucc_lib_h h;
	st = init_version(UCC_API_MAJOR, UCC_API_MINOR, &lp, lcfg, &h);
	lib_config_release(lcfg);
	if (st != UCC_OK) {
		fprintf(stderr, "ucc-check: ucc_init: %s\n", status_string(st));
		return 1;
	}

	ucc_context_config_h ccfg;
	st = ctx_config_read(h, NULL, &ccfg);
	if (st != UCC_OK) {
		fprintf(stderr, "ucc-check: ucc_context_config_read: %s\n", status_string(st));
		return 1;
	}
	ucc_context_params_t cp;
	memset(&cp, 0, sizeof cp);
	cp.mask = UCC_CONTEXT_PARAM_FIELD_OOB | UCC_CONTEXT_PARAM_FIELD_TYPE;
	cp.type = UCC_CONTEXT_EXCLUSIVE;
	cp.oob.allgather = oob_allgather;
	cp.oob.req_test = oob_test;
	cp.oob.req_free = oob_free;
	cp.oob.n_oob_eps = 1;
	cp.oob.oob_ep = 0;
	ucc_context_h ctx;
	st = ctx_create(h, &cp, ccfg, &ctx);
	ctx_config_release(ccfg);
	if (st != UCC_OK) {
		fprintf(stderr, "ucc-check: ucc_context_create: %s\n", status_string(st));
		return 1;
	}
	st = ctx_destroy(ctx);
	if (st != UCC_OK) {
		fprintf(stderr, "ucc-check: ucc_context_destroy: %s\n", status_string(st));
		return 1;
	}
	st = finalize(h);
	if (st != UCC_OK) {
		fprintf(stderr, "ucc-check: ucc_finalize: %s\n", status_string(st));
		return 1;
	}
	loaded_from();
	printf("ucc-check: ok: dlopen, ucc_init, a one-rank context, finalize\n");
	return 0;
}
