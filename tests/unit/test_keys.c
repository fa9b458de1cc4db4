/*
 * API keys (daemon/keys.h): a key is shown once and only its hash is kept; it works until it
 * is revoked, after a reload too; limits are checked on the way in; owners decide what a key
 * sees; an auditor key is read-only, alone of its kind, and older rows load without it.
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "daemon/keys.h"
#include "store/store.h"
#include "tap.h"

static char dir[64], dbpath[128];

#define HASH64 "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff"

int main(void)
{
    snprintf(dir, sizeof(dir), "/tmp/wr-keys-XXXXXX");
    if (!mkdtemp(dir))
        return 1;
    snprintf(dbpath, sizeof(dbpath), "%s/withruntime.db", dir);
    struct wr_err err = {0};
    struct store *st = store_open(dbpath, &err);
    struct keys *k = st ? keys_open(st, &err) : NULL;
    ok(k != NULL, "keys open on an empty store: %s", err.msg);

    char token[KEY_TOKEN_LEN + 1], token2[KEY_TOKEN_LEN + 1];
    struct key_opts o = {.name = "agent", .has_daily_limit = 1, .daily_limit_micros = 5000000};
    const struct api_key *a = keys_create(k, &o, token, &err);
    ok(a && strlen(token) == KEY_TOKEN_LEN && !strncmp(token, "wr_", 3), "a key is made: %s",
       token);
    ok(a && !strncmp(a->id, "key_", 4) && strlen(a->id) == 20, "its id: %s", a ? a->id : "");
    ok(a && !strcmp(a->owner_id, a->id), "it owns its own sandboxes");
    ok(keys_check(k, token) == a, "the key is recognised");
    char wrong[KEY_TOKEN_LEN + 1];
    memcpy(wrong, token, sizeof(wrong));
    wrong[KEY_TOKEN_LEN - 1] = wrong[KEY_TOKEN_LEN - 1] == 'a' ? 'b' : 'a';
    ok(keys_check(k, wrong) == NULL, "a key one character off is not");
    ok(keys_check(k, "") == NULL && keys_check(k, "wr_") == NULL && keys_check(k, NULL) == NULL,
       "empty and short keys are not");
    ok(!tap_file_has(dbpath, token), "the key itself is not in the database");

    struct key_opts dup = {.name = "agent"};
    ok(keys_create(k, &dup, token2, &err) == NULL && err.kind == WR_E_CONFLICT,
       "a second key of the same name is refused: %s", err.msg);
    struct key_opts badname = {.name = "a\nb"};
    ok(keys_create(k, &badname, token2, &err) == NULL && err.kind == WR_E_INVALID,
       "a name with a control character is refused");
    struct key_opts toomuch = {
        .name = "x", .has_daily_limit = 1, .daily_limit_micros = 1000000000001LL};
    ok(keys_create(k, &toomuch, token2, &err) == NULL && strstr(err.msg, "daily_limit_micros"),
       "a limit past a million dollars a day is refused: %s", err.msg);
    struct key_opts stranger = {.name = "x", .owner_id = "key_aaaaaaaaaaaaaaaa"};
    ok(keys_create(k, &stranger, token2, &err) == NULL && strstr(err.msg, "owner_id"),
       "an unknown owner is refused: %s", err.msg);

    struct key_opts ro = {
        .name = "dashboard", .owner_id = a->id, .read_only = 1, .has_read_only = 1};
    const struct api_key *r = keys_create(k, &ro, token2, &err);
    ok(r && r->read_only && !strcmp(r->owner_id, a->id), "a read-only key for agent's sandboxes");
    struct key_opts chain = {.name = "chain", .owner_id = r ? r->id : ""};
    ok(keys_create(k, &chain, token2 + 0, &err) == NULL,
       "a key cannot be made for a key that is not its own owner");

    struct principal who = {0};
    snprintf(who.owner_id, sizeof(who.owner_id), "%s", a->id);
    ok(principal_sees(&who, a->id) && !principal_sees(&who, "") &&
           !principal_sees(&who, "key_other"),
       "a key sees its owner's sandboxes only, not the admin's");
    struct principal admin = {.admin = 1};
    ok(principal_sees(&admin, a->id) && principal_sees(&admin, "") && principal_sees(NULL, "x"),
       "the admin and the daemon see every one");

    struct key_opts up = {
        .has_daily_limit = 1, .daily_limit_micros = -1, .has_max_sandboxes = 1, .max_sandboxes = 3};
    const struct api_key *u = keys_update(k, a->id, &up, &err);
    ok(u && u->daily_limit_micros == -1 && u->max_sandboxes == 3, "limits change");
    ok(keys_update(k, "key_nope", &up, &err) == NULL && err.kind == WR_E_NOT_FOUND,
       "an unknown key cannot be changed");

    /* a reload reads what was stored */
    char id[32];
    snprintf(id, sizeof(id), "%s", a->id);
    keys_free(k);
    k = keys_open(st, &err);
    a = k ? keys_check(k, token) : NULL;
    ok(a && !strcmp(a->id, id) && a->max_sandboxes == 3 && a->daily_limit_micros == -1,
       "after a reload the key works, with its limits");
    ok(keys_check(k, token2) && keys_check(k, token2)->read_only, "and the read-only one too");

    ok(keys_revoke(k, id, NULL, NULL, &err) && keys_check(k, token) == NULL,
       "a revoked key stops at once");
    ok(keys_check(k, token2) == NULL, "and so does the key made for its sandboxes");
    ok(keys_find(k, id) && keys_find(k, id)->revoked_at > 0, "its record stays");
    ok(keys_update(k, id, &up, &err) == NULL && err.kind == WR_E_CONFLICT,
       "a revoked key cannot be changed");
    struct key_opts again = {.name = "agent"};
    ok(keys_create(k, &again, token2, &err) != NULL, "its name is free again");
    keys_free(k);
    k = keys_open(st, &err);
    ok(k && keys_check(k, token) == NULL, "and it stays revoked after a reload");

    json_t *list = keys_list_json(k);
    char *text = json_dumps(list, 0);
    ok(text && !strstr(text, "wr_") && !strstr(text, "sha256") && strstr(text, "\"owner_id\""),
       "the list shows no key and no hash, and each key's owner");
    free(text);
    json_decref(list);

    /* auditor keys */
    struct key_opts aud = {.name = "auditor", .auditor = 1};
    const struct api_key *au = keys_create(k, &aud, token2, &err);
    ok(au && au->auditor && au->read_only && !au->metrics, "an auditor key is read-only");
    json_t *aj = au ? key_to_json(au) : NULL;
    ok(aj && json_is_true(json_object_get(aj, "auditor")), "its record says auditor");
    json_decref(aj);
    struct key_opts bad1 = {.name = "a1", .auditor = 1, .metrics = 1};
    struct key_opts bad2 = {.name = "a2", .auditor = 1, .owner_id = id};
    struct key_opts bad3 = {.name = "a3", .auditor = 1, .has_read_only = 1, .read_only = 0};
    ok(keys_create(k, &bad1, token, &err) == NULL && err.kind == WR_E_INVALID &&
           strstr(err.msg, "metrics"),
       "an auditor key is no metrics key: %s", err.msg);
    ok(keys_create(k, &bad2, token, &err) == NULL && strstr(err.msg, "owner_id"),
       "nor made for another's sandboxes: %s", err.msg);
    ok(keys_create(k, &bad3, token, &err) == NULL && strstr(err.msg, "read_only"),
       "nor writable: %s", err.msg);
    struct key_opts unro = {.has_read_only = 1, .read_only = 0};
    ok(au && keys_update(k, au->id, &unro, &err) == NULL && err.kind == WR_E_CONFLICT,
       "and cannot be made writable later: %s", err.msg);
    /* a row stored before auditor keys existed has no "auditor": it loads as not one */
    ok(store_key_put(st, "key_olderrowolderrow",
                     "{\"name\":\"old\",\"sha256\":\"" HASH64 "\",\"read_only\":false,"
                     "\"daily_limit_micros\":null,\"max_sandboxes\":null,\"created_unix\":1,"
                     "\"revoked_unix\":0}",
                     &err) == 0,
       "an older row is stored");
    char auid[32];
    snprintf(auid, sizeof(auid), "%s", au ? au->id : "");
    keys_free(k);
    k = keys_open(st, &err);
    const struct api_key *old = k ? keys_find(k, "key_olderrowolderrow") : NULL;
    ok(old && !old->auditor && !old->metrics && !old->read_only, "and loads as an ordinary key");
    ok(k && keys_check(k, token2) && keys_check(k, token2)->auditor &&
           !strcmp(keys_check(k, token2)->id, auid),
       "the auditor key stays one after a reload");

    keys_free(k);
    store_close(st);
    char cmd[128];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
    if (system(cmd) != 0)
        return 1;
    return tap_done();
}
